"""Image preprocessing in numpy (+ Pillow for JPEG decoding and resizing); no TensorFlow needed.

Randomness enters only through uniform draws `u_U` in [0, 1) handed in by the caller (one row per
example, see `images.batch_plan`), so every transform is a deterministic function of its inputs: a
resumed or re-sharded input pipeline reproduces the same crops and flips.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np
from PIL import Image

# Per-channel statistics of the training sets, on the [0, 1] scale.
IMAGENET_MEAN_RGB = (0.485, 0.456, 0.406)
IMAGENET_STD_RGB = (0.229, 0.224, 0.225)
CIFAR10_MEAN_RGB = (0.4914, 0.4822, 0.4465)
CIFAR10_STD_RGB = (0.2470, 0.2435, 0.2616)
# scikit-learn's 8x8 digits (pixel values 0..16, scaled to [0, 1]), over all 1797 images.
DIGITS_MEAN = (0.30526,)
DIGITS_STD = (0.37605,)

# Uniform draws used by `sample_crop_box`: (scale, log-ratio) per attempt, then top and left.
CROP_ATTEMPTS = 10
CROP_UNIFORMS = 2 * CROP_ATTEMPTS + 2


def normalize(
    images_BxHxWxC: np.ndarray, mean: Sequence[float], std: Sequence[float], max_value: float = 255.0
) -> np.ndarray:
    """float32 `(x / max_value - mean) / std`, per channel."""
    x = images_BxHxWxC.astype(np.float32) / np.float32(max_value)
    return (x - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)


def sample_crop_box(
    height: int,
    width: int,
    u_U: np.ndarray,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
) -> tuple[int, int, int, int]:
    """Inception-style random crop box `(top, left, crop_h, crop_w)` from `CROP_UNIFORMS` uniforms.

    Each attempt draws an area fraction uniformly from `scale` and an aspect ratio w/h log-uniformly
    from `ratio`, and is accepted if the box fits. After `CROP_ATTEMPTS` failures it falls back to the
    largest centred box whose aspect ratio is clipped into `ratio`.
    """
    if len(u_U) < CROP_UNIFORMS:
        raise ValueError(f"u_U has {len(u_U)} uniforms; sample_crop_box needs {CROP_UNIFORMS}")
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for attempt in range(CROP_ATTEMPTS):
        u_area, u_ratio = u_U[2 * attempt], u_U[2 * attempt + 1]
        target_area = area * (scale[0] + (scale[1] - scale[0]) * u_area)
        aspect = math.exp(log_lo + (log_hi - log_lo) * u_ratio)
        crop_w = int(round(math.sqrt(target_area * aspect)))
        crop_h = int(round(math.sqrt(target_area / aspect)))
        if 0 < crop_w <= width and 0 < crop_h <= height:
            u_top, u_left = u_U[2 * CROP_ATTEMPTS], u_U[2 * CROP_ATTEMPTS + 1]
            top = min(int(u_top * (height - crop_h + 1)), height - crop_h)
            left = min(int(u_left * (width - crop_w + 1)), width - crop_w)
            return top, left, crop_h, crop_w
    image_ratio = width / height
    if image_ratio < ratio[0]:
        crop_w, crop_h = width, int(round(width / ratio[0]))
    elif image_ratio > ratio[1]:
        crop_h, crop_w = height, int(round(height * ratio[1]))
    else:
        crop_h, crop_w = height, width
    return (height - crop_h) // 2, (width - crop_w) // 2, crop_h, crop_w


def decode_image(encoded: bytes) -> Image.Image:
    """Decodes JPEG/PNG bytes to an RGB PIL image (ImageNet has a few greyscale JPEGs)."""
    image = Image.open(io.BytesIO(encoded))
    return image.convert("RGB") if image.mode != "RGB" else image


def random_resized_crop(
    image: Image.Image,
    u_U: np.ndarray,
    size: int,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0),
) -> np.ndarray:
    """uint8 `size x size x 3`: a `sample_crop_box` crop, resized bilinearly (with antialiasing)."""
    top, left, crop_h, crop_w = sample_crop_box(image.height, image.width, u_U, scale, ratio)
    box = (left, top, left + crop_w, top + crop_h)
    return np.asarray(image.resize((size, size), Image.Resampling.BILINEAR, box=box))


def resize_shorter_side(image: Image.Image, size: int) -> Image.Image:
    """Resizes so the shorter side is `size`, keeping the aspect ratio (a no-op if it already is)."""
    width, height = image.size
    if min(width, height) == size:
        return image
    if width <= height:
        new_w, new_h = size, int(round(height * size / width))
    else:
        new_w, new_h = int(round(width * size / height)), size
    return image.resize((new_w, new_h), Image.Resampling.BILINEAR)


def center_crop(image_HxWxC: np.ndarray, size: int) -> np.ndarray:
    """The central `size x size` window (the extra pixel of an odd margin goes to the bottom/right)."""
    height, width = image_HxWxC.shape[:2]
    if height < size or width < size:
        raise ValueError(f"image of shape {image_HxWxC.shape} is smaller than the crop size={size}")
    top, left = (height - size) // 2, (width - size) // 2
    return image_HxWxC[top : top + size, left : left + size]


def flip_where(images_BxHxWxC: np.ndarray, flip_B: np.ndarray) -> np.ndarray:
    """Mirrors (left-right) the images whose `flip_B` is True."""
    return np.where(flip_B[:, None, None, None], images_BxHxWxC[:, :, ::-1], images_BxHxWxC)


def pad_and_random_crop(images_BxHxWxC: np.ndarray, u_Bx2: np.ndarray, pad: int) -> np.ndarray:
    """CIFAR augmentation: zero-pad by `pad` and take a random crop of the original size per example."""
    b, h, w, _ = images_BxHxWxC.shape
    padded = np.pad(images_BxHxWxC, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    top_B = np.minimum((u_Bx2[:, 0] * (2 * pad + 1)).astype(np.int64), 2 * pad)
    left_B = np.minimum((u_Bx2[:, 1] * (2 * pad + 1)).astype(np.int64), 2 * pad)
    rows_BxH = top_B[:, None] + np.arange(h)
    cols_BxW = left_B[:, None] + np.arange(w)
    return padded[np.arange(b)[:, None, None], rows_BxH[:, :, None], cols_BxW[:, None, :]]


def imagenet_train_image(encoded: bytes, u_U: np.ndarray, size: int = 224) -> np.ndarray:
    """Training view of one ImageNet JPEG: random resized crop to `size`, then a flip if u_U[-1] < 0.5.

    Uses `CROP_UNIFORMS + 1` uniforms; returns uint8 `size x size x 3` (normalise per batch).
    """
    crop = random_resized_crop(decode_image(encoded), u_U[:CROP_UNIFORMS], size)
    return crop[:, ::-1] if u_U[CROP_UNIFORMS] < 0.5 else crop


def imagenet_eval_image(encoded: bytes, size: int = 224, resize: int = 256) -> np.ndarray:
    """Evaluation view of one ImageNet JPEG: shorter side to `resize`, central `size` crop; uint8."""
    image = resize_shorter_side(decode_image(encoded), resize)
    return center_crop(np.asarray(image), size)
