"""The experiment's images: the configured dataset with its fixed analysis split (``config.data``), read by the
alignment run (``experiment.py``), the training comparison (``comparison.py``) and the p-estimate study."""

from __future__ import annotations

import ml_collections
import numpy as np

from sera_jax.data import images


def load_data(config: ml_collections.ConfigDict) -> images.ImageData:
    """The configured image dataset with its fixed analysis split."""
    d = config.data
    if d.name == "digits":
        return images.load_image_data("digits", seed=config.seed, validation_size=d.validation_size,
                                      analysis_size=d.analysis_size)
    return images.load_image_data(d.name, data_dir=d.data_dir, seed=config.seed, analysis_size=d.analysis_size)


def analysis_set(data: images.ImageData, num_prompts: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``num_prompts`` images of the analysis split, evaluation-preprocessed, and their labels."""
    batch = data.eval_transform(data.splits["analysis"].read(np.arange(num_prompts)), None)
    return batch["image"], np.asarray(batch["label"], np.int32)
