"""Issue 48 item 9: a finetuning workdir is as complete as a pretraining one: it keeps its tokenizer
(`from_pretrained(run).tokenizer`), `xlgen finetune --workdir=DIR` alone resumes or extends it, the init line names
the unused tensors, and a model family without finetuning heads is a one-line error."""

import json
import os

import pytest

from xlgen import config as config_lib
from xlgen.finetune.readers import synthetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = [
    "--config.data.max_seq_length=32",
    "--config.data.batch_size=4",
    "--config.data.eval_batch_size=8",
    "--config.mesh.num_devices=1",
]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("ftdata")
    synthetic.write_glue(str(d / "sst2"), "sst2", n_train=16, n_dev=8, n_test=2)
    synthetic.write_glue(str(d / "mnli"), "mnli", n_train=16, n_dev=8, n_test=2)
    texts = synthetic.corpus_for(str(d / "sst2")) + synthetic.corpus_for(str(d / "mnli"))
    synthetic.train_sentencepiece(texts, str(d / "spiece.model"), vocab_size=120)
    return d


def _finetune(argv, capsys):
    from xlgen.cli import main

    code = main(["finetune", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_finetune_workdir_is_complete(data, tmp_path, capsys):
    import xlgen
    from data_pipelines.vocab import load_tokenizer_file

    run = str(tmp_path / "sst2")
    base = [f"--config={ROOT}/configs/finetune/tiny.py", "--config.task=glue/sst2", f"--config.data_dir={data}/sst2"]
    code, out, err = _finetune(
        base + TINY + [f"--config.tokenizer={data}/spiece.model", "--config.total_steps=2", f"--workdir={run}"], capsys
    )
    assert code == 0, err
    # the workdir keeps the tokenizer it was finetuned with
    model = xlgen.from_pretrained(run)
    want = load_tokenizer_file(str(data / "spiece.model"))
    assert model.tokenizer is not None and model.tokenizer.vocab_size == want.vocab_size
    text = "a small cue word among filler words"
    assert list(model.tokenizer.encode(text)) == list(want.encode(text)) and len(want.encode(text)) > 3
    # --workdir alone: extend (the stored config, total_steps raised), then nothing left to train
    code, out, err = _finetune([f"--workdir={run}", "--config.total_steps=4"], capsys)
    assert code == 0, err
    assert "total_steps 2 -> 4 at step 2" in out, out
    assert json.load(open(os.path.join(run, "config.json")))["total_steps"] == 4
    assert json.load(open(os.path.join(run, "eval_results.json")))["step"] in (2, 4)
    steps = [json.loads(line)["step"] for line in open(os.path.join(run, "metrics.jsonl"))]
    assert max(steps) == 4
    code, out, err = _finetune([f"--workdir={run}"], capsys)
    assert code == 0 and "nothing to train" in out, (out, err)
    # an MNLI run initialised from it: the init line names the tensors it does not use (the 2-way output layer)
    code, out, err = _finetune(
        [
            f"--config={ROOT}/configs/finetune/tiny.py",
            "--config.task=glue/mnli",
            f"--config.data_dir={data}/mnli",
            f"--config.init_from={run}",
            "--config.total_steps=1",
            f"--workdir={tmp_path / 'mnli'}",
            *TINY,
        ],
        capsys,
    )
    assert code == 0, err
    assert "unused: 2 (logits_proj.bias, logits_proj.kernel)" in out, out
    _check_onnx_export(str(tmp_path / "mnli"), str(tmp_path / "onnx"), capsys)


def _check_onnx_export(run: str, out: str, capsys):
    """`xlgen export --to-onnx` of a finetuned workdir (issue 52): model.onnx with io.json, labels.txt and the
    tokenizer beside it; onnxruntime on a tokenized text at a new batch size and length equals the workdir's
    deployed function within 1e-4."""
    import jax
    import numpy as np
    import onnxruntime as ort

    from data_pipelines.vocab import load_tokenizer_file
    from xlgen import deploy
    from xlgen.interop import export
    from xlgen.train.workdir_model import restore_params

    assert export.main(["--workdir", run, "--to-onnx", out]) == 0, capsys.readouterr().err
    assert {"model.onnx", "io.json", "labels.txt", "spiece.model", ".xlgen-export"} <= set(os.listdir(out))
    io = json.load(open(os.path.join(out, "io.json")))
    assert io["format"] == "onnx" and io["axes"] == {"batch": "symbolic", "length": "symbolic"}
    assert [i["name"] for i in io["inputs"]] == ["input_ids", "token_type_ids", "attention_mask"]
    assert io["inputs"][0]["shape"] == ["batch", "length"] and io["outputs"][0]["shape"] == ["batch", 3]
    assert io["label_names"] == open(os.path.join(out, "labels.txt")).read().split() and len(io["label_names"]) == 3
    tok = load_tokenizer_file(os.path.join(out, "spiece.model"))
    texts = ["a small cue word", "filler words among filler words and more", "cue"]
    length = max(len(tok.encode(t)) for t in texts) + 1
    ids = np.zeros((3, length), np.int32)  # left padding, <cls> last (XLNet)
    mask = np.zeros((3, length), np.int32)
    for r, t in enumerate(texts):
        row = list(tok.encode(t))[: length - 1] + [3]  # any id in place of <cls>: outputs are compared
        ids[r, length - len(row) :], mask[r, length - len(row) :] = row, 1
    arrays = [ids, np.zeros_like(ids), mask]
    (got,) = ort.InferenceSession(os.path.join(out, "model.onnx")).run(
        None, dict(zip(["input_ids", "token_type_ids", "attention_mask"], arrays))
    )
    config, program, params, _ = restore_params(run)
    want = np.asarray(jax.jit(deploy.served(config, program, params, kind_of_run="finetune").fn)(*arrays)[0])
    print(
        f"--to-onnx (finetuned MNLI workdir, batch 3, length {length}): max|onnxruntime - xlgen| = {np.abs(got - want).max():.1e}"
    )
    assert np.abs(got - want).max() <= 1e-4


def test_finetuning_a_family_without_heads_is_one_line(data, tmp_path, capsys):
    """A Transformer-XL run (no finetuning heads in its registry record) as init_from: one line naming the family
    and the families that can be finetuned, exit 2, nothing written."""
    txl = str(tmp_path / "txl")
    config_lib.write_resolved_config(config_lib.load_config(f"{ROOT}/configs/pretrain/txl_tiny.py"), txl)
    wd = tmp_path / "ft"
    code, out, err = _finetune(
        [
            f"--config={ROOT}/configs/finetune/tiny.py",
            "--config.task=glue/sst2",
            f"--config.data_dir={data}/sst2",
            f"--config.init_from={txl}",
            f"--workdir={wd}",
        ],
        capsys,
    )
    assert code == 2 and err.count("\n") == 1, err
    assert f"init_from={txl} holds a transformer_xl model, which has no finetuning heads" in err, err
    assert "xlnet" in err and "funnel" in err and not wd.exists()
