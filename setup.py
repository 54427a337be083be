"""xlgen: Transformer-XL, XLNet and Funnel-Transformer pretraining and finetuning on JAX/Flax."""

from setuptools import find_packages, setup

setup(
    name="xlgen",
    version="0.1.0",
    description="Pretraining and finetuning for Transformer-XL, XLNet and Funnel-Transformer on JAX/Flax (NNX).",
    python_requires=">=3.11",
    # data_pipelines/assets (the embedded corpus) is a data-only directory: listed as a package of its own, as
    # setuptools expects of any directory it installs files from (otherwise it warns, per file, at every install)
    packages=find_packages(include=["xlgen", "xlgen.*", "data_pipelines", "data_pipelines.*", "configs", "configs.*"])
    + ["data_pipelines.assets"],
    package_data={"data_pipelines.assets": ["*"], "configs": ["**/*.py"]},
    include_package_data=True,
    # Exact versions of everything tested are in constraints.txt (`make` installs with `-c constraints.txt`).
    install_requires=[
        "jax>=0.10.2,<0.11",
        "flax>=0.12.8,<0.13",
        "optax>=0.2.8,<0.3",
        "orbax-checkpoint>=0.12.8,<0.13",
        "ml-collections>=1.1,<2",
        "sentencepiece>=0.2,<0.3",
        "tensorflow-datasets>=4.9.10,<5",
        "numpy>=2.0,<3",
        "tensorboardX>=2.6,<3",
        "matplotlib>=3.8",  # xlgen plot
        "tqdm>=4.66",
        "scipy>=1.13",
        "scikit-learn>=1.5",
        "seqeval>=1.2,<2",  # entity-level NER metrics (finetuning conll2003)
        "networkx>=3",  # Planetoid's karate-club graph
        "nltk>=3.9,<4",  # BLEU of xlgen analyze textgen
        "safetensors>=0.4",
        "tokenizers>=0.14,<0.15",
        "absl-py>=2",
        "etils[epath]>=1.7",
    ],
    extras_require={
        # gs:// workdirs and data (etils.epath's GCS backend; TensorBoard events via google-cloud-storage).
        "gcs": ["gcsfs==2026.8.2"],
        # tests/test_remote_paths.py runs train/eval against a local GCS emulator.
        "test": [
            "pytest>=8",
            "pytest-xdist>=3.5",
            "ruff==0.17.6",
            "vulture==2.16",  # make lint: dead code
            "gcsfs==2026.8.2",
            "gcp-storage-emulator==2026.7.19",
            "onnx==1.23.2",  # the --to-onnx tests run the graphs with onnxruntime
            "onnxruntime==1.31.1",
        ],
        "parity": ["torch==2.13.0", "transformers==4.34.1"],
        # xlgen export --to-onnx (the graph is written with onnx and checked by onnxruntime before it is written)
        "deploy": ["onnx==1.23.2", "onnxruntime==1.31.1"],
        "tpu": ["libtpu==0.0.42.1"],
        # xlgen convert --from-tf reads checkpoints without TensorFlow; the extra brings the crc32c check and the
        # TensorFlow that tests/test_tf_import.py writes its checkpoints with (and HF's TF loaders import)
        "tf": ["tensorflow-cpu==2.21.0", "google-crc32c==1.9.0"],
        # optional trackers (config.trackers=wandb,mlflow; xlgen/train/metrics.py): ~100 MB with their dependencies
        "wandb": ["wandb==0.31.0"],
        "mlflow": ["mlflow-skinny==3.17.2"],
        # the TensorBoard server for workdir/tensorboard/ (xlgen writes the event files with tensorboardX)
        "tensorboard": ["tensorboard==2.21.0"],
    },
    entry_points={"console_scripts": ["xlgen=xlgen.cli:console_main"]},
)
