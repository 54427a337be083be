"""Other frameworks' formats: `export` (`xlgen export --to-hf`: an xlgen model as a Hugging Face directory; the
deployed forms `--to-onnx` / `--to-stablehlo` through `xlgen.deploy`), `convert` (`xlgen convert --from-tf`: an
original TensorFlow release as a directory `xlgen.from_pretrained` loads) and `tf_checkpoint` (reading a TF
checkpoint without TensorFlow). The per-family name maps live in the model packages (`hf.py`, `hf_export.py`,
`tf_import.py`); loading a Hugging Face directory is `xlgen.from_pretrained` (`xlgen/pretrained.py`)."""
