"""The tools that use a trained workdir, through the real CLI on one tiny Transformer-XL run (2 steps of
configs/pretrain/txl_tiny.py on the embedded corpus): `xlgen export`, `xlgen generate`, the `xlgen eval`
memory sweep and `xlgen analyze recl`."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from test_train_utils import REPO, compile_cache, run_train, xlgen_env  # noqa: F401

import xlgen

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, compile_cache):  # noqa: F811
    wd = tmp_path_factory.mktemp("txl") / "wd"
    run_train(wd, compile_cache, overrides={"total_steps": 2, "model.n_layer": 1}, devices=1)
    return wd


def xlgen_cli(cache, *args):
    p = subprocess.run(
        [sys.executable, "-m", "xlgen.cli", *args],
        env=xlgen_env(cache, devices=1),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert p.returncode == 0, f"xlgen {' '.join(args)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p


def xlgen_in_process(monkeypatch, cache, *args):
    """`xlgen ARGS` through `xlgen.cli.main` in this process, with the runtime set-up the test session already has
    (its compilation cache, CPU): for a command whose output the test reads with the libraries themselves."""
    from xlgen.cli import main

    monkeypatch.setenv("XLGEN_COMPILATION_CACHE", cache)
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE_MIN_SECS", "0.1")  # tests/conftest.py's
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    assert main(list(args)) == 0, f"xlgen {' '.join(args)}"


def test_export_generate_from_workdir_and_hf_dir(workdir, tmp_path, compile_cache, monkeypatch):  # noqa: F811
    """Export: HF's log-probs (memory carried over two segments) equal `xlgen.from_pretrained(workdir)`'s within
    1e-5 and the exported tokenizer encodes/decodes like the workdir's. Generate: the CLI on the workdir and the
    API on the exported HF directory give the same text for the same seed (two processes, two loaders)."""
    from xlgen.generate import TXLDecoder, load_for_generation

    out = tmp_path / "hf"
    xlgen_in_process(monkeypatch, compile_cache, "export", f"--workdir={workdir}", f"--to-hf={out}")
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
    hf, info = transformers.TransfoXLLMHeadModel.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    hf.eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "ROMEO:\nO, she doth teach the torches!"
    ids = np.asarray([tok.encode(text)] * 2)
    module, wd_tok = load_for_generation(workdir=str(workdir))
    assert ids[0].tolist() == list(wd_tok.encode(text)) and tok.decode(ids[0]) == text
    ours = xlgen.from_pretrained(str(workdir))
    mems_hf = mems_ours = None
    errs = []
    for seg in (ids[:, :12], ids[:, 12:24]):
        with torch.no_grad():
            ref = hf(input_ids=torch.tensor(seg), mems=mems_hf)
        got = ours(input_ids=seg, mems=mems_ours)
        errs.append(float(np.abs(np.asarray(got.log_probs) - ref.prediction_scores.numpy()).max()))
        mems_hf, mems_ours = ref.mems, got.mems
    print(f"export CLI (trained TXL workdir): max|log_probs from_pretrained(workdir) - HF| = {max(errs):.2e}")
    assert max(errs) < 1e-5

    args = ["--prompt=ROMEO:", "--max_new_tokens=24", "--seed=3", "--num_samples=2", "--top_k=5"]
    p = xlgen_cli(compile_cache, "generate", f"--workdir={workdir}", *args)
    assert "tokens/s" in p.stderr
    hf_module, hf_tok = load_for_generation(model=str(out))
    res = TXLDecoder(hf_module).generate(
        list(hf_tok.encode("ROMEO:")), max_new_tokens=24, num_samples=2, seed=3, top_k=5
    )
    texts = ["ROMEO:" + hf_tok.decode(r.tolist()) for r in res["tokens"]]
    assert p.stdout == "".join(f"=== sample {i} ===\n{t}\n" for i, t in enumerate(texts))


def test_export_stablehlo_from_trained_workdir(workdir, tmp_path, compile_cache):  # noqa: F811
    """`--to-stablehlo` on a trained workdir (in-process `xlgen.interop.export.export_deployed`): model.stablehlo, io.json,
    the tokenizer and the export marker; the artefact's log-probs over two segments (memory fed back, starting
    empty: mem_valid 0) equal `xlgen.from_pretrained(workdir)` called with `mem_valid=0` within 1e-5; a second
    export replaces the first."""
    from jax import export as jax_export

    from xlgen.interop import export

    out = tmp_path / "shlo"
    export.export_deployed(str(workdir), str(out), "stablehlo")
    path, desc = export.export_deployed(str(workdir), str(out), "stablehlo")  # replaces its own export
    assert {"model.stablehlo", "io.json", "tokenizer.json", ".xlgen-export"} <= set(os.listdir(out))
    io = json.loads((out / "io.json").read_text())
    assert io == desc and [i["name"] for i in io["inputs"]] == ["input_ids", "mems", "mem_valid"]
    assert [o["name"] for o in io["outputs"]] == ["log_probs", "mems", "mem_valid"]
    assert io["inputs"][0]["shape"][0] == "batch" and io["axes"]["batch"] == "symbolic"
    exp = jax_export.deserialize(bytearray((out / "model.stablehlo").read_bytes()))
    ours = xlgen.from_pretrained(str(workdir))
    n_layer, _, mem_len, d = io["inputs"][1]["shape"]
    length = 12 if io["axes"]["length"] == "symbolic" else io["axes"]["length"]
    ids = np.random.default_rng(0).integers(0, 60, (3, 2 * length)).astype(np.int32)
    mems, valid = np.zeros((n_layer, 3, mem_len, d), np.float32), np.zeros((3,), np.int32)
    ref_mems, ref_valid, errs = None, 0, []
    for seg in (ids[:, :length], ids[:, length:]):
        log_probs, mems, valid = exp.call(seg, mems, valid)
        ref = ours(input_ids=seg, mems=ref_mems, mem_valid=ref_valid, mem_len=mem_len)
        errs.append(float(np.abs(np.asarray(log_probs) - np.asarray(ref.log_probs)).max()))
        ref_mems, ref_valid = ref.mems, ref.mem_valid
    print(f"--to-stablehlo (trained TXL workdir): max|log_probs artefact - from_pretrained| = {max(errs):.2e}")
    assert max(errs) < 1e-5


def test_eval_memory_sweep_and_recl_write_json_and_png(workdir, compile_cache):  # noqa: F811
    p = xlgen_cli(compile_cache, "eval", f"--workdir={workdir}", "--config.eval.mem_len=8,32,16")
    sweep = json.loads((workdir / "eval_mem_len_sweep.json").read_text())
    assert [r["mem_len"] for r in sweep["results"]] == [8, 16, 32]
    assert all(np.isfinite(r["bpc"]) and abs(r["bpc"] - r["loss"] / np.log(2)) < 1e-9 for r in sweep["results"])
    assert (workdir / "eval_mem_len_sweep.png").stat().st_size > 1000 and "mem_len 16" in p.stdout
    # one evaluation of the sweep equals a plain `xlgen eval` with that memory
    one = xlgen_cli(compile_cache, "eval", f"--workdir={workdir}", "--config.eval.mem_len=16")
    loss = float(one.stdout.split("loss ")[1].split()[0])
    assert abs(loss - sweep["results"][1]["loss"]) <= 5e-5 + 1e-9  # `xlgen eval` prints 4 decimals

    out = workdir / "recl.json"
    cmd = ["analyze", "recl"] if _has_analyze() else None
    argv = [f"--workdir={workdir}", "--delta=8", "--max_context=32", "--max_tokens=600", f"--json={out}"]
    if cmd:
        xlgen_cli(compile_cache, *cmd, *argv)
    else:  # until the `xlgen analyze` dispatcher exists
        code = f"import sys; from xlgen.analyze import recl; sys.exit(recl.main({argv!r}))"
        p = subprocess.run([sys.executable, "-c", code], env=xlgen_env(compile_cache, devices=1), cwd=REPO)
        assert p.returncode == 0
    res = json.loads(out.read_text())
    assert set(res["per_r"]) == {"0.1", "0.5", "1.0"}
    assert all(8 <= res["per_r"][r]["recl"][str(workdir)] <= 32 for r in res["per_r"])
    assert out.with_suffix(".png").stat().st_size > 1000


def _has_analyze():
    from xlgen import cli

    return "analyze" in cli.DELEGATED
