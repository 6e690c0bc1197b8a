"""Image pipelines: preprocessing on synthetic images, the resumable sharded stream, digits splits,
and the TFDS paths (cifar10, imagenet2012) on tiny datasets written by TFDS itself in a tmp dir."""

import functools
import io
import math
import os
import pathlib
import tarfile

import numpy as np
import pytest
from PIL import Image

from sera_jax.data import image_transforms as T
from sera_jax.data import images

# ----------------------------------------------------------------------------- preprocessing


def _uniforms(area=0.5, ratio=0.5, top=0.0, left=0.0, attempts=T.CROP_ATTEMPTS):
    u = np.zeros(T.CROP_UNIFORMS + 1)
    u[0 : 2 * attempts : 2], u[1 : 2 * attempts : 2] = area, ratio
    u[2 * T.CROP_ATTEMPTS], u[2 * T.CROP_ATTEMPTS + 1] = top, left
    return u


def test_crop_box_matches_hand_computation():
    # area fraction 0.08 + 0.92 * 0.5 = 0.54 of 100x100, aspect exp(0) = 1: side round(sqrt(5400)) = 73;
    # top = floor(0.25 * (100 - 73 + 1)) = 7, left = floor(0.999 * 28) = 27.
    assert T.sample_crop_box(100, 100, _uniforms(top=0.25, left=0.999)) == (7, 27, 73, 73)
    # u_ratio = 1 gives aspect 4/3: w = round(sqrt(5400 * 4/3)) = 85, h = round(sqrt(5400 * 3/4)) = 64.
    assert T.sample_crop_box(100, 100, _uniforms(ratio=1.0)) == (0, 0, 64, 85)


def test_crop_box_fallback_is_centred_with_clipped_ratio():
    # A 10x1000 strip: every attempt's box is taller than 10 px, so the fallback takes the full height
    # and width round(10 * 4/3) = 13, centred at left (1000 - 13) // 2 = 493.
    assert T.sample_crop_box(10, 1000, _uniforms(area=1.0, ratio=1.0)) == (0, 493, 10, 13)
    assert T.sample_crop_box(1000, 10, _uniforms(area=1.0, ratio=0.0)) == (493, 0, 13, 10)
    assert T.sample_crop_box(90, 100, _uniforms(area=1.0, ratio=1.0)) == (0, 0, 90, 100)


def test_crop_boxes_lie_inside_with_scale_and_ratio_in_range():
    rng = np.random.default_rng(0)
    for height, width in [(375, 500), (500, 333), (64, 64), (30, 400)]:
        for _ in range(200):
            top, left, h, w = T.sample_crop_box(height, width, rng.random(T.CROP_UNIFORMS))
            assert 0 <= top and top + h <= height and 0 <= left and left + w <= width
            if (h, w) != (height, width) and (top, left) != ((height - h) // 2, (width - w) // 2):
                # An accepted attempt: scale and ratio in range up to the rounding of h and w.
                assert 0.08 * height * width - (h + w) <= h * w <= height * width
                assert 3 / 4 - 2 / h <= w / h <= 4 / 3 + 2 / h


def test_random_resized_crop_is_the_box_resized():
    image = np.random.default_rng(1).integers(0, 256, (50, 60, 3), dtype=np.uint8)
    u = _uniforms(area=0.3, ratio=0.5, top=0.4, left=0.7)
    top, left, h, w = T.sample_crop_box(50, 60, u)
    assert (h, w) == (round(math.sqrt(0.08 * 3000 + 0.92 * 0.3 * 3000)),) * 2
    # Resizing a box to its own size is exact, so the crop must be the plain slice.
    out = T.random_resized_crop(Image.fromarray(image), u, size=h)
    np.testing.assert_array_equal(out, image[top : top + h, left : left + w])
    assert T.random_resized_crop(Image.fromarray(image), u, size=24).shape == (24, 24, 3)


def _png(image_HxWxC):
    buf = io.BytesIO()
    Image.fromarray(image_HxWxC).save(buf, format="PNG")  # lossless, unlike JPEG
    return buf.getvalue()


def test_train_image_flips_on_last_uniform():
    image = np.random.default_rng(2).integers(0, 256, (40, 30, 3), dtype=np.uint8)
    u = _uniforms(area=0.9, ratio=0.6, top=0.3, left=0.6)
    u[T.CROP_UNIFORMS] = 0.9
    plain = T.imagenet_train_image(_png(image), u, size=24)
    u[T.CROP_UNIFORMS] = 0.1
    flipped = T.imagenet_train_image(_png(image), u, size=24)
    assert plain.shape == (24, 24, 3) and plain.dtype == np.uint8
    np.testing.assert_array_equal(flipped, plain[:, ::-1])
    assert not np.array_equal(flipped, plain)


def test_center_crop_and_eval_view_are_exact():
    h, w = 256, 301
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    image = np.stack([rows % 256, cols % 256, (rows + cols) % 256], -1).astype(np.uint8)
    # Margins: (256 - 224) // 2 = 16 rows on top, (301 - 224) // 2 = 38 columns on the left.
    expected = image[16:240, 38:262]
    np.testing.assert_array_equal(T.center_crop(image, 224), expected)
    # The shorter side is already 256, so the eval view is exactly the centre crop.
    np.testing.assert_array_equal(T.imagenet_eval_image(_png(image)), expected)
    with pytest.raises(ValueError, match="size=300"):
        T.center_crop(image, 300)


def test_resize_shorter_side_shapes():
    def resized(h, w):
        return T.resize_shorter_side(Image.new("RGB", (w, h)), 256).size[::-1]

    assert resized(300, 400) == (256, 341)  # 400 * 256 / 300 = 341.3
    assert resized(500, 200) == (640, 256)
    assert resized(100, 100) == (256, 256)
    assert T.imagenet_eval_image(_png(np.zeros((300, 500, 3), np.uint8))).shape == (224, 224, 3)


def test_normalize_per_channel():
    x = np.zeros((2, 1, 1, 3), np.uint8)
    x[1] = 255
    out = T.normalize(x, T.IMAGENET_MEAN_RGB, T.IMAGENET_STD_RGB)
    assert out.dtype == np.float32
    for c, (m, s) in enumerate(zip(T.IMAGENET_MEAN_RGB, T.IMAGENET_STD_RGB)):
        assert out[0, 0, 0, c] == pytest.approx(-m / s, rel=1e-6)
        assert out[1, 0, 0, c] == pytest.approx((1 - m) / s, rel=1e-6)


def test_pad_and_random_crop_offsets():
    x = np.random.default_rng(3).integers(1, 256, (3, 6, 6, 1), dtype=np.uint8)
    # u -> offset floor(u * 9) in the 4-padded image: 0 (shift down-right), 4 (identity), 8.
    u = np.array([[0.0, 0.0], [0.5, 0.5], [0.999, 0.0]])
    out = T.pad_and_random_crop(x, u, pad=4)
    assert out.shape == x.shape
    np.testing.assert_array_equal(out[0, 4:, 4:], x[0, :2, :2])
    assert np.all(out[0, :4] == 0)
    np.testing.assert_array_equal(out[1], x[1])
    np.testing.assert_array_equal(out[2, :2, 4:], x[2, 4:, :2])


# ----------------------------------------------------------------------------- the stream


def test_batch_plan_visits_every_example_once_per_epoch():
    n, g = 10, 4
    stream = np.concatenate([images.batch_plan(7, s, g, n)[0] for s in range(15)])  # 6 epochs
    for e in range(6):
        assert sorted(stream[e * n : (e + 1) * n]) == list(range(n))
    assert not np.array_equal(stream[:n], stream[n : 2 * n])  # reshuffled each epoch
    other = np.concatenate([images.batch_plan(8, s, g, n)[0] for s in range(15)])
    assert not np.array_equal(stream, other)
    idx, u = images.batch_plan(7, 3, g, n)
    np.testing.assert_array_equal(idx, stream[12:16])
    assert u.shape == (g, images.NUM_UNIFORMS) and 0 <= u.min() and u.max() < 1


def test_batch_larger_than_dataset_spans_epochs():
    idx, _ = images.batch_plan(0, 0, 7, 3)
    assert sorted(idx[:3]) == sorted(idx[3:6]) == [0, 1, 2]


@pytest.fixture(scope="module")
def toy():
    """16 random 6x6 RGB images with labels 0..15 and a CIFAR-like augmenting transform."""
    rng = np.random.default_rng(4)
    source = images.ArraySource(rng.integers(0, 256, (16, 6, 6, 3), dtype=np.uint8), np.arange(16))
    train = functools.partial(
        images.array_transform, mean=(0.5,) * 3, std=(0.25,) * 3, max_value=255.0, crop_pad=2, flip=True
    )
    return source, train


def _take(it, k):
    return [next(it) for _ in range(k)]


def test_host_shards_concatenate_to_the_single_host_batch(toy):
    source, train = toy
    with images.TrainIterator(source, train, 8, seed=1, process_index=0, process_count=1) as it:
        single = _take(it, 5)
    for count in (2, 4):
        hosts = [
            _take(images.TrainIterator(source, train, 8, seed=1, process_index=i, process_count=count), 5)
            for i in range(count)
        ]
        for step in range(5):
            for key in ("image", "label"):
                joined = np.concatenate([hosts[i][step][key] for i in range(count)])
                np.testing.assert_array_equal(joined, single[step][key])
    assert single[0]["image"].shape == (8, 6, 6, 3) and single[0]["image"].dtype == np.float32
    assert single[0]["label"].dtype == np.int32
    # Augmentation is on: the same example does not always come out identical.
    plain = images.array_transform(
        source.read(np.arange(16)), None, mean=(0.5,) * 3, std=(0.25,) * 3, max_value=255.0
    )
    first = single[0]
    assert any(not np.array_equal(first["image"][i], plain["image"][first["label"][i]]) for i in range(8))


def test_resume_from_integer_state_reproduces_batches(toy):
    source, train = toy
    it = images.TrainIterator(source, train, 4, seed=3, process_count=1, process_index=0, prefetch=3)
    reference = _take(it, 8)
    assert it.get_state() == 8
    resumed = images.TrainIterator(source, train, 4, seed=3, start_step=5, process_count=1, process_index=0)
    assert resumed.get_state() == 5
    for a, b in zip(reference[5:], _take(resumed, 3)):
        np.testing.assert_array_equal(a["image"], b["image"])
        np.testing.assert_array_equal(a["label"], b["label"])
    it.set_state(2)  # rewinding drops the prefetched batches
    np.testing.assert_array_equal(next(it)["image"], reference[2]["image"])
    no_prefetch = images.TrainIterator(source, train, 4, seed=3, process_count=1, process_index=0, prefetch=0)
    np.testing.assert_array_equal(next(no_prefetch)["image"], reference[0]["image"])
    it.close()
    resumed.close()


def test_eval_covers_each_example_once_with_equal_batches_per_host(toy):
    source, train = toy
    n, g, count = len(source), 6, 3  # per host: ceil(16 / 3) = 6 examples in 3 batches of 2
    seen = []
    for i in range(count):
        batches = list(
            images.eval_batches(source, train, g, process_index=i, process_count=count)
        )
        assert len(batches) == images.num_eval_batches(n, g, count) == 3
        for b in batches:
            assert b["image"].shape == (2, 6, 6, 3) and b["mask"].dtype == bool
            seen.extend(b["label"][b["mask"]])
    assert sorted(seen) == list(range(n))
    # No augmentation in evaluation: images are the normalised originals.
    first = next(images.eval_batches(source, train, 4, process_index=0, process_count=1))
    np.testing.assert_allclose(first["image"], (source.images_ExHxWxC[:4] / 255.0 - 0.5) / 0.25, atol=1e-6)


def test_bad_stream_arguments_raise(toy):
    source, train = toy
    with pytest.raises(ValueError, match="global_batch_size=6"):
        images.TrainIterator(source, train, 6, seed=0, process_index=0, process_count=4)
    with pytest.raises(ValueError, match="process_index=2"):
        images.TrainIterator(source, train, 4, seed=0, process_index=2, process_count=2)
    with pytest.raises(ValueError, match="step=-1"):
        images.TrainIterator(source, train, 4, seed=0, start_step=-1, process_index=0, process_count=1)


# ----------------------------------------------------------------------------- digits


def test_digits_splits_deterministic_disjoint_and_complete():
    data = images.load_digits_data(seed=0, validation_size=200, analysis_size=100)
    again = images.load_digits_data(seed=0, validation_size=200, analysis_size=100)
    other = images.load_digits_data(seed=1, validation_size=200, analysis_size=100)
    parts = {k: set(data.splits[k].indices_E.tolist()) for k in ("train", "analysis", "validation")}
    assert [len(parts[k]) for k in ("train", "analysis", "validation")] == [1497, 100, 200]
    assert not (parts["train"] & parts["analysis"] or parts["train"] & parts["validation"])
    assert not parts["analysis"] & parts["validation"]
    assert set.union(*parts.values()) == set(range(1797))
    for k in parts:
        np.testing.assert_array_equal(data.splits[k].indices_E, again.splits[k].indices_E)
    assert not np.array_equal(data.splits["validation"].indices_E, other.splits["validation"].indices_E)


def test_digits_batches_are_normalised_real_digits():
    from sklearn.datasets import load_digits

    data = images.load_image_data("digits", seed=0)
    assert (data.num_classes, data.image_shape) == (10, (8, 8, 1))
    batch = next(data.train_iterator(64, seed=0, process_index=0, process_count=1, prefetch=0))
    assert batch["image"].shape == (64, 8, 8, 1) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int32
    everything = np.concatenate(
        [b["image"] for b in data.eval_iterator("validation", 300, process_index=0, process_count=1)]
    )
    # Validation images are the scikit-learn images at the carved indices, normalised.
    raw = load_digits().images[data.splits["validation"].indices_E]
    np.testing.assert_allclose(everything[..., 0], (raw / 16.0 - 0.30526) / 0.37605, rtol=1e-5, atol=1e-5)
    all_pixels = load_digits().images / 16.0
    assert all_pixels.mean() == pytest.approx(T.DIGITS_MEAN[0], abs=1e-4)
    assert all_pixels.std() == pytest.approx(T.DIGITS_STD[0], abs=1e-4)


def test_unknown_names_and_splits_raise():
    with pytest.raises(ValueError, match="name='mnist'"):
        images.load_image_data("mnist")
    data = images.load_digits_data()
    with pytest.raises(ValueError, match="split='test'"):
        data.eval_iterator("test", 8)


# ----------------------------------------------------------------------------- missing data


def test_missing_cifar_data_dir_names_it_and_the_fix(tmp_path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="nowhere") as err:
        images.load_cifar10_data(missing)
    assert "download_and_prepare" in str(err.value)


def test_missing_imagenet_names_manual_dir_and_tars(tmp_path):
    manual = tmp_path / "manual"
    manual.mkdir()
    with pytest.raises(FileNotFoundError) as err:
        images.load_imagenet_data(str(tmp_path / "nowhere"), manual_dir=str(manual))
    msg = str(err.value)
    assert str(manual) in msg and "ILSVRC2012_img_train.tar" in msg and "ILSVRC2012_img_val.tar" in msg
    (manual / "ILSVRC2012_img_train.tar").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="lacks ILSVRC2012_img_val.tar;"):
        images.prepare_imagenet(str(tmp_path / "data"), str(manual))


def test_unprepared_tfds_dir_raises_file_not_found(tmp_path):
    pytest.importorskip("tensorflow_datasets", reason="the tfds extra is not installed")
    with pytest.raises(FileNotFoundError, match="not prepared") as err:
        images.load_cifar10_data(str(tmp_path))
    assert str(tmp_path) in str(err.value)
    with pytest.raises(FileNotFoundError, match="ILSVRC2012_img_train.tar"):
        images.load_imagenet_data(str(tmp_path))


# ----------------------------------------------------------------------------- TFDS on tiny data


@pytest.fixture(scope="module")
def tfds_env():
    pytest.importorskip("tensorflow", reason="preparing TFDS datasets needs the tfds extra (tensorflow)")
    return pytest.importorskip("tensorflow_datasets", reason="needs the tfds extra")


def _cifar_example(split_seed, i):
    rng = np.random.default_rng([split_seed, i])
    return rng.integers(0, 256, (32, 32, 3), dtype=np.uint8), (3 * i + split_seed) % 10


@pytest.fixture(scope="module")
def cifar_dir(tfds_env, tmp_path_factory):
    """A tiny cifar10 (20 train / 6 test) written by TFDS with the real cifar10 features and layout."""
    from tensorflow_datasets.image_classification import cifar

    class TinyCifar10(cifar.Cifar10, skip_registration=True):
        name = "cifar10"  # the real builder will find and read these files

        def _split_generators(self, dl_manager):
            return {"train": self._examples(0, 20), "test": self._examples(1, 6)}

        def _examples(self, split_seed, n):
            for i in range(n):
                image, label = _cifar_example(split_seed, i)
                yield f"{split_seed}_{i}", {"id": f"{split_seed}_{i}", "image": image, "label": label}

    data_dir = str(tmp_path_factory.mktemp("tfds_cifar"))
    TinyCifar10(data_dir=data_dir).download_and_prepare(
        download_config=tfds_env.download.DownloadConfig(try_download_gcs=False)
    )
    return data_dir


def test_cifar10_reads_tfds_files(cifar_dir):
    data = images.load_image_data("cifar10", data_dir=cifar_dir, analysis_size=5)
    assert [data.num_examples(s) for s in ("train", "analysis", "validation")] == [20, 5, 6]
    expected = {_cifar_example(1, i)[0].tobytes(): _cifar_example(1, i)[1] for i in range(6)}
    (batch,) = list(data.eval_iterator("validation", 6, process_index=0, process_count=1))
    for image, label in zip(batch["image"], batch["label"]):
        raw = np.round((image * T.CIFAR10_STD_RGB + T.CIFAR10_MEAN_RGB) * 255).astype(np.uint8)
        assert expected[raw.tobytes()] == label  # pixels and labels survived the TFDS round trip
    train = next(data.train_iterator(8, seed=0, process_index=0, process_count=1, prefetch=0))
    assert train["image"].shape == (8, 32, 32, 3) and train["label"].dtype == np.int32


def _jpeg(h, w, seed):
    image = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def _add(tar, name, data):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def imagenet_dirs(tfds_env, tmp_path_factory):
    """ILSVRC2012-shaped tars (2 synsets x 3 train images, 3 val images), prepared by TFDS's builder."""
    root = tmp_path_factory.mktemp("imagenet")
    manual, data_dir = root / "manual", root / "data"
    manual.mkdir()
    jpegs = {}
    with tarfile.open(manual / "ILSVRC2012_img_train.tar", "w") as outer:
        for s, synset in enumerate(["n01440764", "n01443537"]):
            inner = io.BytesIO()
            with tarfile.open(fileobj=inner, mode="w") as tar:
                for i in range(3):
                    name = f"{synset}_{i}.JPEG"
                    jpegs[name] = _jpeg(40 + 7 * i, 50 + 5 * s, seed=10 * s + i)
                    _add(tar, name, jpegs[name])
            _add(outer, f"{synset}.tar", inner.getvalue())
    with tarfile.open(manual / "ILSVRC2012_img_val.tar", "w") as tar:
        for i in range(1, 4):
            name = f"ILSVRC2012_val_{i:08d}.JPEG"
            jpegs[name] = _jpeg(30 + i, 45, seed=100 + i)
            _add(tar, name, jpegs[name])
    images.prepare_imagenet(str(data_dir), str(manual))
    return str(data_dir), str(manual), jpegs


def test_imagenet_manual_dir_prepare_and_read(tfds_env, imagenet_dirs):
    data_dir, manual, jpegs = imagenet_dirs
    data = images.load_image_data(
        "imagenet2012", data_dir=data_dir, manual_dir=manual, analysis_size=2, num_workers=2
    )
    assert [data.num_examples(s) for s in ("train", "analysis", "validation")] == [6, 2, 3]
    # Validation labels: the first three lines of TFDS's validation label file, as class indices.
    label_dir = os.path.join(os.path.dirname(tfds_env.__file__), "datasets", "imagenet2012")
    synsets = pathlib.Path(label_dir, "labels.txt").read_text().split()
    val_synsets = pathlib.Path(label_dir, "validation_labels.txt").read_text().split()[:3]
    (batch,) = list(data.eval_iterator("validation", 4, process_index=0, process_count=1))
    np.testing.assert_array_equal(batch["mask"], [True, True, True, False])
    assert batch["image"].shape == (4, 224, 224, 3) and batch["image"].dtype == np.float32
    # TFDS stores our JPEG bytes, so each eval image equals our own eval view of one original; the
    # k-th validation file (sorted by name) must carry the k-th label of the label file.
    names = sorted(n for n in jpegs if n.startswith("ILSVRC"))
    ours = [
        T.normalize(T.imagenet_eval_image(jpegs[n])[None], T.IMAGENET_MEAN_RGB, T.IMAGENET_STD_RGB)[0]
        for n in names
    ]
    matched = []
    for image, label in zip(batch["image"][:3], batch["label"][:3]):
        (k,) = [k for k, o in enumerate(ours) if np.array_equal(image, o)]
        assert label == synsets.index(val_synsets[k])
        matched.append(k)
    assert sorted(matched) == [0, 1, 2]
    # Training batches: label = synset index (n01440764 -> 0, n01443537 -> 1), 224 px crops.
    with data.train_iterator(6, seed=0, process_index=0, process_count=1) as it:
        train = next(it)
    assert sorted(train["label"].tolist()) == [0, 0, 0, 1, 1, 1]
    assert train["image"].shape == (6, 224, 224, 3)


def test_imagenet_prepared_as_tfrecord_explains_conversion(tfds_env, imagenet_dirs, tmp_path):
    _, manual, _ = imagenet_dirs
    # TFDS's default file format has no random access; the loader must say how to fix that.
    builder = tfds_env.builder("imagenet2012", data_dir=str(tmp_path))
    builder.download_and_prepare(download_config=tfds_env.download.DownloadConfig(manual_dir=manual))
    with pytest.raises(FileNotFoundError, match="ArrayRecord") as err:
        images.load_imagenet_data(str(tmp_path))
    assert "convert_format" in str(err.value) and str(tmp_path) in str(err.value)
