"""Image-classification input pipelines yielding numpy batches {"image": float32 BxHxWxC, "label": int32 B}.

Datasets (`load_image_data(name, ...)`):
  - "digits": scikit-learn's 8x8 digits (shipped with scikit-learn), split by seed into
    train / analysis / validation (disjoint).
  - "cifar10": TFDS cifar10 already prepared in `data_dir` (never downloaded), held in memory.
  - "imagenet2012": TFDS imagenet2012 prepared from the manual download (`prepare_imagenet`) as
    ArrayRecord files, read by random access; JPEGs are decoded and augmented with Pillow/numpy.

Every split is a random-access `Source`. The training stream is a pure function of
(seed, step): global batch `step` (of B examples) takes positions `[step * B, (step + 1) * B)` of the
concatenation of per-epoch permutations, and its augmentation uniforms come from `(seed, step)`. So the
iterator's whole state is the integer `step` (checkpoint it, resume with `start_step`), and each host takes
its own contiguous slice of the global batch: the union over hosts is the same whatever the host count.
Evaluation iterates a split once in order, per-host shards padded to whole batches, with a boolean "mask".

Shape letters: B examples of a batch (global or per-host, as the array says), E examples of a whole split
(a `Source`), U uniform draws per example, H x W x C an image.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np

from sera_jax.data import image_transforms as T

Batch = dict[str, np.ndarray]
# (raw records from `Source.read`, uniforms_BxU for training or None for evaluation) -> Batch
Transform = Callable[[dict[str, Any], "np.ndarray | None"], Batch]

# Uniform draws per example and step; transforms use a prefix (ImageNet training needs 23).
NUM_UNIFORMS = 32

IMAGENET_TARS = ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar")


class Source(Protocol):
    """Random access to raw examples: `read` returns {"image": ..., "label": int array} for indices_B."""

    def __len__(self) -> int: ...

    def read(self, indices_B: np.ndarray) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class ArraySource:
    """The E examples of a split held in memory: integer-valued images (uint8) and labels."""

    images_ExHxWxC: np.ndarray
    labels_E: np.ndarray

    def __post_init__(self):
        if len(self.images_ExHxWxC) != len(self.labels_E):
            raise ValueError(
                f"images_ExHxWxC has {len(self.images_ExHxWxC)} rows but labels_E has {len(self.labels_E)}"
            )

    def __len__(self) -> int:
        return len(self.labels_E)

    def read(self, indices_B: np.ndarray) -> dict[str, Any]:
        return {"image": self.images_ExHxWxC[indices_B], "label": self.labels_E[indices_B]}


@dataclasses.dataclass(frozen=True)
class SubsetSource:
    """The E examples `indices_E` of another source, renumbered 0..E-1."""

    source: Source
    indices_E: np.ndarray

    def __len__(self) -> int:
        return len(self.indices_E)

    def read(self, indices_B: np.ndarray) -> dict[str, Any]:
        return self.source.read(self.indices_E[indices_B])


class RecordSource:
    """A TFDS random-access split (ArrayRecord) whose "image" feature is left encoded (bytes)."""

    def __init__(self, data_source: Any):
        self._data_source = data_source

    def __len__(self) -> int:
        return len(self._data_source)

    def read(self, indices_B: np.ndarray) -> dict[str, Any]:
        records = self._data_source.__getitems__([int(i) for i in indices_B])
        return {
            "image": [r["image"] for r in records],
            "label": np.asarray([r["label"] for r in records], np.int64),
        }


# ----------------------------------------------------------------------------- stream positions


@functools.lru_cache(maxsize=4)
def epoch_permutation(seed: int, epoch: int, num_examples: int) -> np.ndarray:
    """The (read-only, cached) order in which epoch `epoch` of the training stream visits examples."""
    perm_E = np.random.default_rng([seed, 0, epoch]).permutation(num_examples)
    perm_E.setflags(write=False)
    return perm_E


def batch_plan(
    seed: int, step: int, global_batch_size: int, num_examples: int
) -> tuple[np.ndarray, np.ndarray]:
    """Example indices_B and uniforms_BxU of global batch `step` of the infinite shuffled stream.

    Position t of the stream is example `epoch_permutation(seed, t // E, E)[t % E]` (E = num_examples,
    B = global_batch_size), so every epoch visits each example exactly once and a batch may straddle two
    epochs.
    """
    if seed < 0:
        raise ValueError(f"seed={seed} must be >= 0")
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    if num_examples < 1:
        raise ValueError(f"num_examples={num_examples} must be >= 1")
    pos_B = step * global_batch_size + np.arange(global_batch_size, dtype=np.int64)
    epoch_B, within_B = np.divmod(pos_B, num_examples)
    indices_B = np.empty(global_batch_size, np.int64)
    for epoch in np.unique(epoch_B):
        here = epoch_B == epoch
        indices_B[here] = epoch_permutation(seed, int(epoch), num_examples)[within_B[here]]
    uniforms_BxU = np.random.default_rng([seed, 1, step]).random((global_batch_size, NUM_UNIFORMS))
    return indices_B, uniforms_BxU


def _host_layout(
    global_batch_size: int, process_index: int | None, process_count: int | None
) -> tuple[int, int, int]:
    """(process_index, process_count, per-host batch size), defaulting to this JAX process."""
    index = jax.process_index() if process_index is None else int(process_index)
    count = jax.process_count() if process_count is None else int(process_count)
    if count < 1 or not 0 <= index < count:
        raise ValueError(f"process_index={index} must lie in [0, process_count={count})")
    if global_batch_size < 1 or global_batch_size % count:
        raise ValueError(
            f"global_batch_size={global_batch_size} must be a positive multiple of process_count={count}"
        )
    return index, count, global_batch_size // count


class TrainIterator:
    """Infinite shuffled, augmented batches for this host; `get_state()` is the next step (an int).

    Batches are prepared `prefetch` steps ahead in a background thread; the state counts batches
    handed out, so checkpointing it mid-prefetch is exact.
    """

    def __init__(
        self,
        source: Source,
        transform: Transform,
        global_batch_size: int,
        *,
        seed: int,
        start_step: int = 0,
        process_index: int | None = None,
        process_count: int | None = None,
        prefetch: int = 2,
    ):
        self._index, self._count, self.host_batch_size = _host_layout(
            global_batch_size, process_index, process_count
        )
        if seed < 0:
            raise ValueError(f"seed={seed} must be >= 0")
        if prefetch < 0:
            raise ValueError(f"prefetch={prefetch} must be >= 0")
        if len(source) < 1:
            raise ValueError("source is empty")
        self.source = source
        self.transform = transform
        self.global_batch_size = global_batch_size
        self.seed = seed
        self._prefetch = prefetch
        self._pending: collections.deque[tuple[int, concurrent.futures.Future]] = collections.deque()
        self._executor = concurrent.futures.ThreadPoolExecutor(1) if prefetch else None
        self._step = 0
        self.set_state(start_step)

    def make_batch(self, step: int) -> Batch:
        """This host's share of global batch `step` (pure: depends only on the constructor args)."""
        indices_B, uniforms_BxU = batch_plan(self.seed, step, self.global_batch_size, len(self.source))
        rows = slice(self._index * self.host_batch_size, (self._index + 1) * self.host_batch_size)
        return self.transform(self.source.read(indices_B[rows]), uniforms_BxU[rows])

    def __iter__(self) -> TrainIterator:
        return self

    def __next__(self) -> Batch:
        step = self._step
        if self._executor is None:
            batch = self.make_batch(step)
        else:
            next_wanted = self._pending[-1][0] + 1 if self._pending else step
            while next_wanted <= step + self._prefetch:
                self._pending.append((next_wanted, self._executor.submit(self.make_batch, next_wanted)))
                next_wanted += 1
            pending_step, future = self._pending.popleft()
            assert pending_step == step, (pending_step, step)
            batch = future.result()
        self._step = step + 1
        return batch

    def get_state(self) -> int:
        """The step of the next batch; `set_state` / `start_step` with it resumes the stream exactly."""
        return self._step

    def set_state(self, step: int) -> None:
        if int(step) < 0:
            raise ValueError(f"step={step} must be >= 0")
        for _, future in self._pending:
            future.cancel()
        self._pending.clear()
        self._step = int(step)

    def close(self) -> None:
        self.set_state(self._step)
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def __enter__(self) -> TrainIterator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def num_eval_batches(num_examples: int, global_batch_size: int, process_count: int) -> int:
    """Batches each host yields in one evaluation pass (equal on all hosts, so collectives line up)."""
    per_host = math.ceil(num_examples / process_count)
    return math.ceil(per_host / (global_batch_size // process_count))


def eval_batches(
    source: Source,
    transform: Transform,
    global_batch_size: int,
    *,
    process_index: int | None = None,
    process_count: int | None = None,
) -> Iterator[Batch]:
    """One ordered pass over this host's contiguous shard; batches padded to full size with mask=False."""
    index, count, host_batch = _host_layout(global_batch_size, process_index, process_count)
    n = len(source)
    per_host = math.ceil(n / count)
    start, stop = index * per_host, min((index + 1) * per_host, n)
    for b in range(num_eval_batches(n, global_batch_size, count)):
        pos_B = start + b * host_batch + np.arange(host_batch, dtype=np.int64)
        mask_B = pos_B < stop
        # Padding rows re-read example 0; the mask removes them from any statistic.
        batch = transform(source.read(np.where(mask_B, pos_B, 0)), None)
        batch["mask"] = mask_B
        yield batch


# ----------------------------------------------------------------------------- transforms


def array_transform(
    raw: dict[str, Any],
    uniforms_BxU: np.ndarray | None,
    *,
    mean: Sequence[float],
    std: Sequence[float],
    max_value: float,
    crop_pad: int = 0,
    flip: bool = False,
) -> Batch:
    """In-memory images: optional pad-and-crop and flip (training only), then normalisation."""
    images = np.asarray(raw["image"])
    if uniforms_BxU is not None:
        if crop_pad:
            images = T.pad_and_random_crop(images, uniforms_BxU[:, :2], crop_pad)
        if flip:
            images = T.flip_where(images, uniforms_BxU[:, 2] < 0.5)
    return {"image": T.normalize(images, mean, std, max_value), "label": np.asarray(raw["label"], np.int32)}


@functools.lru_cache(maxsize=None)
def _thread_pool(num_workers: int) -> concurrent.futures.ThreadPoolExecutor:
    """A process-wide decoding pool (Pillow releases the GIL while decoding and resizing)."""
    return concurrent.futures.ThreadPoolExecutor(num_workers, thread_name_prefix="image_decode")


def imagenet_transform(
    raw: dict[str, Any],
    uniforms_BxU: np.ndarray | None,
    *,
    image_size: int = 224,
    resize_size: int = 256,
    num_workers: int = 8,
) -> Batch:
    """Encoded JPEGs -> random-resized-crop + flip (training) or resize + centre crop (eval), normalised."""
    pool = _thread_pool(num_workers)
    if uniforms_BxU is None:
        decode = functools.partial(T.imagenet_eval_image, size=image_size, resize=resize_size)
        images = list(pool.map(decode, raw["image"]))
    else:
        decode = functools.partial(T.imagenet_train_image, size=image_size)
        images = list(pool.map(decode, raw["image"], uniforms_BxU))
    images_BxHxWxC = np.stack(images)
    return {
        "image": T.normalize(images_BxHxWxC, T.IMAGENET_MEAN_RGB, T.IMAGENET_STD_RGB),
        "label": np.asarray(raw["label"], np.int32),
    }


# ----------------------------------------------------------------------------- datasets


@dataclasses.dataclass(frozen=True)
class ImageData:
    """A dataset's splits (random-access sources) and its training / evaluation transforms."""

    name: str
    splits: Mapping[str, Source]
    train_transform: Transform
    eval_transform: Transform
    num_classes: int
    image_shape: tuple[int, int, int]  # HxWxC of the model input

    def _source(self, split: str) -> Source:
        if split not in self.splits:
            raise ValueError(f"split={split!r} not in {self.name} splits {sorted(self.splits)}")
        return self.splits[split]

    def num_examples(self, split: str) -> int:
        return len(self._source(split))

    def train_iterator(
        self,
        global_batch_size: int,
        *,
        seed: int,
        split: str = "train",
        start_step: int = 0,
        process_index: int | None = None,
        process_count: int | None = None,
        prefetch: int = 2,
    ) -> TrainIterator:
        """Infinite shuffled augmented batches of `split`; resume with `start_step=it.get_state()`."""
        return TrainIterator(
            self._source(split),
            self.train_transform,
            global_batch_size,
            seed=seed,
            start_step=start_step,
            process_index=process_index,
            process_count=process_count,
            prefetch=prefetch,
        )

    def eval_iterator(
        self,
        split: str,
        global_batch_size: int,
        *,
        process_index: int | None = None,
        process_count: int | None = None,
    ) -> Iterator[Batch]:
        """One pass over `split` with evaluation preprocessing; batches carry a boolean "mask"."""
        return eval_batches(
            self._source(split),
            self.eval_transform,
            global_batch_size,
            process_index=process_index,
            process_count=process_count,
        )


def carve_indices(num_examples: int, seed: int, sizes: Sequence[int]) -> list[np.ndarray]:
    """Disjoint random subsets of range(num_examples) with the given sizes, then the rest; each sorted."""
    if seed < 0:
        raise ValueError(f"seed={seed} must be >= 0")
    if any(s < 0 for s in sizes) or sum(sizes) > num_examples:
        raise ValueError(f"sizes={list(sizes)} must be >= 0 and sum to at most num_examples={num_examples}")
    # Stream 2 of the seed: independent of the training-order (0) and augmentation (1) streams.
    perm = np.random.default_rng([seed, 2]).permutation(num_examples)
    bounds = np.cumsum([0, *sizes])
    parts = [perm[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])] + [perm[bounds[-1] :]]
    return [np.sort(p) for p in parts]


@functools.lru_cache(maxsize=1)
def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(uint8 images_Ex8x8x1 with values 0..16, int32 labels_E), read once per process."""
    from sklearn.datasets import load_digits  # local: keeps scikit-learn off the import path otherwise

    digits = load_digits()
    images_Ex8x8x1 = digits.images.astype(np.uint8)[..., None]
    images_Ex8x8x1.setflags(write=False)
    labels_E = digits.target.astype(np.int32)
    labels_E.setflags(write=False)
    return images_Ex8x8x1, labels_E


def load_digits_data(*, seed: int = 0, validation_size: int = 300, analysis_size: int = 300) -> ImageData:
    """scikit-learn's 1797 8x8 digits as 8x8x1 images, split by `seed` into disjoint
    validation / analysis / train (the rest). No augmentation: flips or shifts change what a digit is."""
    source = ArraySource(*_digits_arrays())
    val_idx, analysis_idx, train_idx = carve_indices(len(source), seed, [validation_size, analysis_size])
    transform = functools.partial(array_transform, mean=T.DIGITS_MEAN, std=T.DIGITS_STD, max_value=16.0)
    return ImageData(
        name="digits",
        splits={
            "train": SubsetSource(source, train_idx),
            "analysis": SubsetSource(source, analysis_idx),
            "validation": SubsetSource(source, val_idx),
        },
        train_transform=transform,
        eval_transform=transform,
        num_classes=10,
        image_shape=(8, 8, 1),
    )


def _import_tfds() -> Any:
    try:
        import tensorflow_datasets as tfds
    except ImportError as e:
        raise ImportError(
            "reading TFDS datasets needs tensorflow-datasets (and tensorflow for preparing / reading "
            "TFRecord files): pip install -e '.[tfds]'"
        ) from e
    return tfds


def _check_data_dir(data_dir: str | os.PathLike | None, how_to_prepare: str) -> str:
    if data_dir is None:
        raise ValueError(f"data_dir must be given (a TFDS data directory). {how_to_prepare}")
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(f"data_dir={data_dir!r} does not exist. {how_to_prepare}")
    return data_dir


def _prepared_builder(name: str, data_dir: str, how_to_prepare: str, **builder_kwargs: Any) -> Any:
    """The TFDS builder of `name` in `data_dir`; FileNotFoundError if it is not prepared there."""
    tfds = _import_tfds()
    builder = tfds.builder(name, data_dir=data_dir, **builder_kwargs)
    if not builder.is_prepared():
        raise FileNotFoundError(
            f"TFDS dataset {name!r} is not prepared in data_dir={data_dir!r} (no {builder.data_dir}/"
            f"dataset_info.json); nothing is downloaded at run time. {how_to_prepare}"
        )
    return builder


def _cifar10_hint(data_dir: Any) -> str:
    data_dir = "<data_dir>" if data_dir is None else os.fspath(data_dir)
    return (
        "Prepare it where there is network access with `python -c \"import tensorflow_datasets as tfds; "
        f"tfds.builder('cifar10', data_dir='{data_dir}').download_and_prepare()\"` and copy the "
        f"resulting cifar10/ folder into {data_dir}."
    )


def load_cifar10_data(
    data_dir: str | os.PathLike | None,
    *,
    seed: int = 0,
    analysis_size: int = 10_000,
    analysis_disjoint: bool = False,
    augment: bool = True,
) -> ImageData:
    """TFDS cifar10 from `data_dir`, in memory (~180 MB). Needs tensorflow (TFDS reads TFRecords with it).

    "validation" is the test split; "analysis" is a fixed seeded subset of the training split (removed
    from "train" if `analysis_disjoint`). Training augmentation: 4-pixel pad + random crop, flip.
    """
    data_dir = _check_data_dir(data_dir, _cifar10_hint(data_dir))
    builder = _prepared_builder("cifar10", data_dir, _cifar10_hint(data_dir))
    tfds = _import_tfds()

    def read(split: str) -> ArraySource:
        arrays = tfds.as_numpy(builder.as_dataset(split=split, batch_size=-1))
        return ArraySource(np.asarray(arrays["image"], np.uint8), np.asarray(arrays["label"], np.int32))

    train, test = read("train"), read("test")
    sizes = [min(analysis_size, len(train))]
    analysis_idx, rest_idx = carve_indices(len(train), seed, sizes)
    norm = dict(mean=T.CIFAR10_MEAN_RGB, std=T.CIFAR10_STD_RGB, max_value=255.0)
    return ImageData(
        name="cifar10",
        splits={
            "train": SubsetSource(train, rest_idx) if analysis_disjoint else train,
            "analysis": SubsetSource(train, analysis_idx),
            "validation": test,
        },
        train_transform=functools.partial(
            array_transform, crop_pad=4 if augment else 0, flip=augment, **norm
        ),
        eval_transform=functools.partial(array_transform, **norm),
        num_classes=10,
        image_shape=(32, 32, 3),
    )


def _imagenet_hint(data_dir: Any, manual_dir: Any) -> str:
    where = f"manual_dir={os.fspath(manual_dir)!r}" if manual_dir is not None else "a manual_dir"
    missing = ""
    if manual_dir is not None:
        absent = [t for t in IMAGENET_TARS if not os.path.isfile(os.path.join(manual_dir, t))]
        missing = f" (missing there: {', '.join(absent)})" if absent else " (both tars are there)"
    return (
        f"Put {' and '.join(IMAGENET_TARS)} (from image-net.org) into {where}{missing} and run once "
        "`python -c \"from sera_jax.data import images; images.prepare_imagenet("
        f"'{data_dir or '<data_dir>'}', '{manual_dir or '<manual_dir>'}')\"` "
        "(needs the tfds extra with tensorflow; writes ArrayRecord files; takes hours)."
    )


def prepare_imagenet(data_dir: str | os.PathLike, manual_dir: str | os.PathLike) -> None:
    """Builds TFDS imagenet2012 in `data_dir` from the ILSVRC2012 tars in `manual_dir` (needs tensorflow).

    Writes ArrayRecord files, which the loader reads by random access. Run it once, on one host.
    """
    data_dir, manual_dir = os.fspath(data_dir), os.fspath(manual_dir)
    absent = [t for t in IMAGENET_TARS if not os.path.isfile(os.path.join(manual_dir, t))]
    if absent:
        raise FileNotFoundError(
            f"manual_dir={manual_dir!r} lacks {', '.join(absent)}; it must hold "
            f"{' and '.join(IMAGENET_TARS)} as downloaded from image-net.org (ILSVRC 2012)."
        )
    os.makedirs(data_dir, exist_ok=True)
    tfds = _import_tfds()
    builder = tfds.builder("imagenet2012", data_dir=data_dir, file_format="array_record")
    builder.download_and_prepare(
        download_config=tfds.download.DownloadConfig(manual_dir=manual_dir), file_format="array_record"
    )


def load_imagenet_data(
    data_dir: str | os.PathLike | None,
    *,
    manual_dir: str | os.PathLike | None = None,
    seed: int = 0,
    analysis_size: int = 10_000,
    analysis_disjoint: bool = False,
    image_size: int = 224,
    resize_size: int = 256,
    num_workers: int | None = None,
) -> ImageData:
    """TFDS imagenet2012 (prepared by `prepare_imagenet`) read by random access; no tensorflow needed.

    "validation" is ILSVRC's validation set; "analysis" is a fixed seeded subset of the training split
    (MaxRL measured gradient alignment on 10k training images), removed from "train" if
    `analysis_disjoint`. `manual_dir` only makes the error message precise when data is missing.
    """
    hint = _imagenet_hint(data_dir, manual_dir)
    data_dir = _check_data_dir(data_dir, hint)
    # No file_format here: TFDS takes it from the prepared dataset_info.json and refuses a mismatch.
    builder = _prepared_builder("imagenet2012", data_dir, hint)
    tfds = _import_tfds()
    try:
        train_ds, val_ds = (
            builder.as_data_source(split, decoders={"image": tfds.decode.SkipDecoding()})
            for split in ("train", "validation")
        )
    except NotImplementedError as e:  # prepared as TFRecords, which have no random access
        raise FileNotFoundError(
            f"imagenet2012 in data_dir={data_dir!r} has no ArrayRecord files ({e}). Convert it with "
            "`tfds convert_format --dataset_version_dir=<that version dir> --out_file_format=array_record` "
            f"or prepare it again: {hint}"
        ) from e
    train, val = RecordSource(train_ds), RecordSource(val_ds)
    analysis_idx, rest_idx = carve_indices(len(train), seed, [min(analysis_size, len(train))])
    transform = functools.partial(
        imagenet_transform,
        image_size=image_size,
        resize_size=resize_size,
        num_workers=num_workers or os.cpu_count() or 1,
    )
    return ImageData(
        name="imagenet2012",
        splits={
            "train": SubsetSource(train, rest_idx) if analysis_disjoint else train,
            "analysis": SubsetSource(train, analysis_idx),
            "validation": val,
        },
        train_transform=transform,
        eval_transform=transform,
        num_classes=1000,
        image_shape=(image_size, image_size, 3),
    )


_LOADERS: dict[str, Callable[..., ImageData]] = {
    "digits": load_digits_data,
    "cifar10": load_cifar10_data,
    "imagenet2012": load_imagenet_data,
}


def load_image_data(name: str, **kwargs: Any) -> ImageData:
    """`load_<name>_data(**kwargs)` for name in "digits", "cifar10", "imagenet2012" (for configs)."""
    if name not in _LOADERS:
        raise ValueError(f"name={name!r} is not a known image dataset; expected one of {sorted(_LOADERS)}")
    return _LOADERS[name](**kwargs)
