"""sera_jax: Scale-Equalized Rollout Allocation for Maximum Likelihood RL, in JAX/Flax."""

from setuptools import find_packages, setup

INSTALL_REQUIRES = [
    # The JAX the suite runs on (CI tests 0.10.2, tunix 0.1.7's): newer releases are untested here, older ones lack
    # APIs the code calls (jax.set_mesh, explicit mesh axis types).
    "jax>=0.10.2,<0.11",
    "flax>=0.11,<0.13",
    "optax>=0.2.4,<0.3",
    "orbax-checkpoint>=0.11,<0.13",
    "chex>=0.1.89,<0.2",
    "ml-collections>=1.0,<2",
    "absl-py>=2.1,<3",
    "numpy>=1.26",
    "scipy>=1.11",
    "matplotlib>=3.8",
    "tqdm>=4.66",
    "tensorboardX>=2.6",
    "tokenizers>=0.20,<1",
    "safetensors>=0.4",
    "scikit-learn>=1.4",
    "jinja2>=3.1",  # chat templates of tokenizers
    "sympy>=1.12",  # symbolic answer equivalence in the math grader
    "pillow>=10",  # image preprocessing
]

EXTRAS = {
    # Running the tests and executing the notebooks.
    "dev": [
        "pytest>=8",
        "pytest-xdist>=3.5",
        "hypothesis>=6.100",
        "nbclient>=0.10",
        "nbformat>=5.10",
        "ipykernel>=6.29",
    ],
    # Reading TFDS datasets (cifar10, imagenet2012 from a manual download).
    "tfds": ["tensorflow-datasets>=4.9.6,<5", "tensorflow-cpu>=2.16", "importlib_resources"],
    # Parity tests of the decoder against Hugging Face transformers (PyTorch, CPU).
    # torch 2.13.0's CPU wheel ships on the project's machines; elsewhere pip would fetch a CUDA build.
    # transformers 5.12.1: the newest that accepts tunix's safetensors<0.8, so parity and tunix share one env.
    "parity": ["torch==2.13.0", "transformers==5.12.1"],
    # A reference math grader for the math-reasoning experiment.
    "math": ["math-verify>=0.7", "pyarrow>=15"],
    # SERA inside tunix's RL learners (sera_jax.integrations.tunix), pinned: the learner builds on its classes.
    "tunix": ["google-tunix==0.1.7"],
    # Weights & Biases as one more metric sink (log.wandb); offline mode needs no account.
    "wandb": ["wandb>=0.19.10,<1"],
    # Compiling for GPUs and TPUs without one (python -m experiments.plan --target/--topology): the TPU compiler
    # (libtpu, which jax[tpu]==0.10.2 resolves to), XLA:GPU (the CUDA plugin at the project's jax), ptxas, which
    # XLA:GPU needs to emit a cubin on a machine without CUDA, and cuDNN (with cuBLAS), whose attention XLA:GPU
    # builds at compile time: without it a config that resolves attention to cuDNN does not compile. Pinned at the
    # versions the plans were compiled with; 4 GB, about 40 s into .venv from the pip cache; no driver needed.
    "targets": ["jax[tpu]==0.10.2", "jax-cuda12-plugin==0.10.2", "nvidia-cuda-nvcc-cu12==12.9.86",
                "nvidia-cudnn-cu12==9.28.0.42"],
}

setup(
    name="sera_jax",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["sera_jax", "sera_jax.*", "experiments", "experiments.*"]),
    python_requires=">=3.11",
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    package_data={"sera_jax.train": ["target_configs/*.txtpb"]},  # the GPU targets' XLA specs (train/targets.py)
)
