"""gs:// workdirs, checkpoints and data end to end against a local GCS emulator (no network, no mocks).

A `gcp-storage-emulator` server runs in a subprocess on a free localhost port. gcsfs (etils.epath's gs:// backend)
and tensorboardX/google-cloud-storage reach it through STORAGE_EMULATOR_HOST, Orbax's array data (TensorStore's own
GCS driver) through TENSORSTORE_GCS_HTTP_URL with GOOGLE_AUTH_TOKEN_FOR_TESTING (TensorStore skips credential
discovery). The real `xlgen prepare`, `xlgen train`, `xlgen eval` and `xlgen finetune` CLI entry points run in this
process (the fixture's environment reaches gcsfs and TensorStore; the paths, not a process boundary, are the point):

* a corpus prepared straight into gs://test-bucket/corpus holds byte-identical shards to a local preparation;
* a run on gs://test-bucket/run (data from the bucket) interrupted by --stop_at_step and resumed with the same
  command logs losses bitwise equal to an uninterrupted local run on the local corpus, with metrics.jsonl,
  config.json, checkpoints and TensorBoard events in the bucket; `xlgen eval` appends its record there;
* remote shards are memory-mapped from the local cache under their manifest sha256;
* `xlgen.from_pretrained("gs://...")` returns the same log-probs as from the local workdir;
* finetuning with data_dir, tokenizer and workdir in the bucket equals the local run, and init_from=gs://... works;
* metrics.jsonl on an object store is buffered, rewritten whole on flush and truncated on resume.
"""

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from test_train_utils import REPO, compile_cache, train_cmd, train_losses  # noqa: F401

pytest.importorskip("gcsfs", reason="gs:// needs gcsfs: pip install -e '.[gcs,test]'")
pytest.importorskip("gcp_storage_emulator", reason="the GCS emulator test needs gcp-storage-emulator (.[test])")

BUCKET = "test-bucket"
K = 3

# The emulator does not send `x-goog-generation` with media downloads; TensorStore (Orbax's OCDBT manifests) reads
# every object's generation from that header, as real GCS sends it. The server adds it; nothing of ours is touched.
_EMULATOR = """
import time
from gcp_storage_emulator.handlers import objects
from gcp_storage_emulator.server import create_server

_download = objects.download


def download(request, response, storage, *args, **kwargs):
    _download(request, response, storage, *args, **kwargs)
    try:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # not found: the handler already answered 404
        return
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])


objects.download = download
server = create_server("127.0.0.1", {port}, in_memory=True, default_bucket="{bucket}")
server.start()
time.sleep(3600)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """The emulator's URL; this process's env points gcsfs/TensorStore at it for the module's duration."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    code = _EMULATOR.format(port=port, bucket=BUCKET)
    log = open(tmp_path_factory.mktemp("emulator") / "emulator.log", "w")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.time() < deadline, "the GCS emulator did not start"
            time.sleep(0.1)
    env = {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "emulator",
        "GOOGLE_CLOUD_PROJECT": "test",
        "XLGEN_CACHE_DIR": str(tmp_path_factory.mktemp("xlgen_cache")),
    }
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        proc.kill()
        proc.wait()
        log.close()


@pytest.fixture
def cli(monkeypatch, capsys, compile_cache):
    """`cli(argv)`: `xlgen.cli.main(argv)` in this process, asserted to exit 0; its stdout. The CLI's runtime set-up
    keeps the session's compilation cache."""
    from xlgen import cli as cli_lib

    monkeypatch.setenv("XLGEN_COMPILATION_CACHE", compile_cache)
    monkeypatch.setenv("XLGEN_COMPILATION_CACHE_MIN_SECS", "0")

    def run(argv):
        capsys.readouterr()
        code = cli_lib.main([str(a) for a in argv])
        out = capsys.readouterr()
        assert code == 0, f"exit {code}\n{out.out[-3000:]}\n{out.err[-5000:]}"
        return out.out

    return run


def _cli_train(workdir, overrides, extra=()):
    """The arguments of `xlgen train` for the tiny Transformer-XL (`train_cmd` without the interpreter)."""
    cmd = train_cmd(workdir, "txl_tiny.py", overrides, extra)
    return cmd[cmd.index("train") :]


def _prepare(output, corpus_dir):
    """`xlgen prepare corpus` (its CLI entry point, in this process: the fixture's environment reaches gcsfs)."""
    from data_pipelines import prepare

    assert (
        prepare.main(
            [
                "corpus",
                "--train",
                str(corpus_dir / "train.txt"),
                "--valid",
                str(corpus_dir / "valid.txt"),
                "--tokenizer",
                "char",
                "--layout",
                "lm",
                "--output",
                str(output),
            ]
        )
        == 0
    )


def _gs(path: str):
    from data_pipelines import paths

    return paths.as_path(f"gs://{BUCKET}/{path}")


def test_gs_backend_is_gcsfs_with_or_without_tensorflow(tmp_path):
    """With TensorFlow importable (a `tensorflow` package on the path), bare etils.epath would send URLs through
    tf.io.gfile; data_pipelines.paths pins them to fsspec/gcsfs, for its own paths and for every epath.Path made
    afterwards in the process (Orbax's), unless the user set EPATH_USE_TF."""
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("raise ImportError('never imported: find_spec only')\n")
    code = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('tensorflow').origin.startswith(sys.argv[1])\n"
        "if sys.argv[2] == 'xlgen':\n"
        "    from data_pipelines import paths\n"
        "from etils import epath\n"
        "print(type(epath.Path('s3://bucket/run')._backend).__name__)\n"
    )  # s3:// is chosen like gs://, without etils' zonal-bucket lookup (a GCS API call) under TensorFlow
    env = {k: v for k, v in os.environ.items() if k != "EPATH_USE_TF"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), REPO, env.get("PYTHONPATH", "")])

    def backend(mode, **extra):
        cmd = [sys.executable, "-c", code, str(tmp_path), mode]
        p = subprocess.run(cmd, env={**env, **extra}, capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr[-2000:]
        return p.stdout.strip()

    assert backend("bare") == "_TfBackend"  # what etils does on its own once TensorFlow is installed
    assert backend("xlgen") == "_FileSystemSpecBackend"
    assert backend("xlgen", EPATH_USE_TF="1") == "_TfBackend"  # the user's explicit choice is kept


def _losses(text: str) -> dict:
    return {r["step"]: r["loss"] for r in map(json.loads, text.splitlines()) if "split" not in r}


@pytest.mark.slow
def test_train_resume_eval_on_gcs_equals_local(tmp_path, gcs, cli):
    text = open(os.path.join(REPO, "data_pipelines", "assets", "tinyshakespeare.txt"), encoding="utf-8").read()
    (tmp_path / "train.txt").write_text(text[:-20000], encoding="utf-8")
    (tmp_path / "valid.txt").write_text(text[-20000:], encoding="utf-8")

    # The same corpus prepared locally and straight into the bucket: byte-identical shards and vocabulary.
    _prepare(tmp_path / "corpus", tmp_path)
    _prepare(f"gs://{BUCKET}/corpus", tmp_path)
    local_m = json.loads((tmp_path / "corpus" / "manifest.json").read_text())
    remote_m = json.loads(_gs("corpus/manifest.json").read_text())
    assert remote_m["tokenizer"] == local_m["tokenizer"]
    for split in ("train", "valid"):
        for a, b in zip(local_m["splits"][split]["shards"], remote_m["splits"][split]["shards"]):
            assert a["tokens"] == b["tokens"] and a["tokens_sha256"] == b["tokens_sha256"]
            assert _gs(f"corpus/{b['tokens']}").read_bytes() == (tmp_path / "corpus" / a["tokens"]).read_bytes()

    over = {"total_steps": 2 * K, "checkpoint.every_steps": K, "mesh.num_devices": 1}
    local = str(tmp_path / "local")
    cli(_cli_train(local, {**over, "data.source": str(tmp_path / "corpus")}))

    run = f"gs://{BUCKET}/run"
    remote_over = {**over, "data.source": f"gs://{BUCKET}/corpus", "tensorboard": True}
    cli(_cli_train(run, remote_over, extra=[f"--stop_at_step={K}"]))
    assert sorted(_losses(_gs("run/metrics.jsonl").read_text())) == list(range(1, K + 1))
    assert _gs(f"run/checkpoints/{K}").is_dir()
    out = cli(_cli_train(run, remote_over))  # the same command resumes
    assert f"resumed from {run}/checkpoints/{K}" in out

    a, b = train_losses(local), _losses(_gs("run/metrics.jsonl").read_text())
    assert sorted(b) == list(range(1, 2 * K + 1))
    assert [b[s] for s in sorted(b)] == [a[s] for s in sorted(b)]  # bitwise, before and after the resume
    cfg = json.loads(_gs("run/config.json").read_text())
    assert cfg["data"]["source"] == f"gs://{BUCKET}/corpus" and cfg["xlgen"]["kind"] == "pretrain"
    assert any("tfevents" in p.name for p in _gs("run/tensorboard").iterdir())

    # `xlgen eval` on the bucket workdir appends its record to the bucket's metrics.jsonl.
    cli(["eval", *_cli_train(run, dict(remote_over, **{"eval.steps": 2}))[1:]])
    ev = [json.loads(line) for line in _gs("run/metrics.jsonl").read_text().splitlines() if '"split"' in line][-1]
    assert ev["step"] == 2 * K and ev["split"] == "valid" and np.isfinite(ev["loss"])

    # Remote shards (train, and valid for the eval) were read from the local cache, named and verified by the manifest's sha256.
    cached = set(os.listdir(os.path.join(gcs["XLGEN_CACHE_DIR"], "shards")))
    want = {f"{sh['tokens_sha256']}.npy" for s in ("train", "valid") for sh in remote_m["splits"][s]["shards"]}
    assert want <= cached

    # from_pretrained on the bucket workdir == on the local one (the same parameters, restored through Orbax).
    import xlgen

    ids = np.arange(24, dtype=np.int32).reshape(2, 12) % 74
    out_remote = xlgen.from_pretrained(run)(ids)
    out_local = xlgen.from_pretrained(local)(ids)
    np.testing.assert_array_equal(np.asarray(out_remote.log_probs), np.asarray(out_local.log_probs))


def test_metrics_truncate_and_cache_on_gcs(gcs, tmp_path):
    """metrics.jsonl on an object store: buffered, rewritten whole on flush, truncated after a restored step;
    a cached shard whose bytes do not match the manifest's sha256 is an error naming the file."""
    from data_pipelines import paths
    from xlgen.train import metrics as metrics_lib

    wd = f"gs://{BUCKET}/metrics-run"
    w = metrics_lib.MetricsWriter(wd, tensorboard=False, flush_secs=3600)
    for s in range(1, 6):
        w.write({"step": s, "loss": 1.0 / s})
    assert not _gs("metrics-run/metrics.jsonl").exists()  # buffered until a flush
    w.flush()
    assert [r["step"] for r in metrics_lib.read_metrics(w.path)] == [1, 2, 3, 4, 5]
    w.write({"step": 6, "loss": 0.1})
    w.close()
    assert metrics_lib.truncate_after(w.path, 4) == 2
    w = metrics_lib.MetricsWriter(wd, tensorboard=False)  # a resumed run appends after the kept records
    w.write({"step": 5, "loss": 0.5})
    w.close()
    assert [(r["step"], r["loss"]) for r in metrics_lib.read_metrics(w.path)] == [
        (1, 1.0),
        (2, 0.5),
        (3, 1.0 / 3),
        (4, 0.25),
        (5, 0.5),
    ]

    paths.atomic_write_bytes(f"gs://{BUCKET}/blob.npy", b"abc")
    with pytest.raises(ValueError, match=r"gs://test-bucket/blob.npy: sha256 .* does not match"):
        paths.local_copy(f"gs://{BUCKET}/blob.npy", sha256="0" * 64, subdir="shards")
    got = paths.local_copy(f"gs://{BUCKET}/blob.npy", subdir="shards")
    assert open(got, "rb").read() == b"abc"
    (tmp_path / "x.npy").write_bytes(b"local")
    assert paths.local_copy(str(tmp_path / "x.npy")) == str(tmp_path / "x.npy")  # local files are used in place


@pytest.mark.slow
def test_finetune_with_gcs_data_tokenizer_workdir_and_init_from(gcs, tmp_path, cli):
    """`xlgen finetune` with data_dir, tokenizer and workdir on gs:// gives exactly the local run's losses, dev
    results and prediction files; `--config.init_from=gs://...` starts a new run from the bucket workdir's tensors."""
    from data_pipelines import paths
    from xlgen import finetune as ft
    from xlgen.finetune.readers import synthetic

    data = tmp_path / "sst2"
    synthetic.write_glue(str(data), "sst2", n_train=64, n_dev=16, n_test=4)
    synthetic.train_sentencepiece(synthetic.corpus_for(str(data)), str(tmp_path / "spiece.model"), vocab_size=100)
    for f in data.rglob("*"):
        if f.is_file():
            paths.atomic_write_bytes(f"gs://{BUCKET}/glue/sst2/{f.relative_to(data)}", f.read_bytes())
    paths.atomic_write_bytes(f"gs://{BUCKET}/glue/spiece.model", (tmp_path / "spiece.model").read_bytes())

    def finetune(workdir, **over):
        over = {
            "task": "glue/sst2",
            "total_steps": 4,
            "eval_every_steps": 0,
            "log_every_steps": 1,
            "checkpoint.every_steps": 4,
            "mesh.num_devices": 1,
            **over,
        }
        return cli(
            ["finetune", f"--config={REPO}/configs/finetune/tiny.py", f"--workdir={workdir}"]
            + [f"--config.{k}={v}" for k, v in over.items()]
        )

    local, remote = str(tmp_path / "ft"), f"gs://{BUCKET}/ft"
    finetune(local, data_dir=data, tokenizer=tmp_path / "spiece.model")
    finetune(remote, data_dir=f"gs://{BUCKET}/glue/sst2", tokenizer=f"gs://{BUCKET}/glue/spiece.model")
    best = json.load(open(os.path.join(local, "eval_results.json")))
    assert json.loads(_gs("ft/eval_results.json").read_text()) == best and best["step"] == 4
    for name in ("dev_predictions.tsv", "submission/SST-2.tsv"):
        assert _gs(f"ft/{name}").read_text() == open(os.path.join(local, name)).read()
    assert _losses(_gs("ft/metrics.jsonl").read_text()) == train_losses(local)
    assert ft.is_finetune_workdir(remote) and any(p.name.endswith(".npz") for p in _gs("ft/cache").iterdir())
    a, b = ft.pretrained_params(remote), ft.pretrained_params(local)  # the bucket's best/ checkpoint == local
    assert sorted(a) == sorted(b) and all(np.array_equal(a[k], b[k]) for k in a)

    # A new run initialised from the bucket workdir (architecture from its config.json, every tensor loaded).
    out = finetune(
        f"gs://{BUCKET}/ft2",
        data_dir=f"gs://{BUCKET}/glue/sst2",
        init_from=remote,
        tokenizer=f"gs://{BUCKET}/glue/spiece.model",
        total_steps=1,
        **{"checkpoint.every_steps": 1},
    )
    assert f"init_from {remote}: {len(a)} tensors loaded; fresh: none" in out
    assert json.loads(_gs("ft2/config.json").read_text())["init_from"] == remote


def test_hf_weights_from_gcs(gcs, tmp_path):
    """A Hugging Face directory in the bucket: config.json dispatch and weights (safetensors, and pytorch_model.bin
    when torch is installed) read exactly as from the local copy."""
    from safetensors.numpy import save_file

    from data_pipelines import paths
    from xlgen import pretrained

    rng = np.random.default_rng(0)
    weights = {
        "transformer.word_emb.weight": rng.standard_normal((7, 4)).astype(np.float32),
        "crit.cutoff_ends": np.arange(3, dtype=np.int64),
    }
    save_file(weights, str(tmp_path / "model.safetensors"))
    paths.atomic_write_bytes(f"gs://{BUCKET}/hf/st/model.safetensors", (tmp_path / "model.safetensors").read_bytes())
    paths.atomic_write_text(f"gs://{BUCKET}/hf/st/config.json", json.dumps({"model_type": "nope"}))
    got = pretrained.read_hf_state_dict(f"gs://{BUCKET}/hf/st")
    assert sorted(got) == sorted(weights) and all(np.array_equal(got[k], weights[k]) for k in weights)
    with pytest.raises(ValueError, match=r"gs://test-bucket/hf/st/config.json: model_type='nope' is not supported"):
        pretrained.from_pretrained(f"gs://{BUCKET}/hf/st")
    torch = pytest.importorskip("torch")
    torch.save({k: torch.from_numpy(v) for k, v in weights.items()}, str(tmp_path / "pytorch_model.bin"))
    paths.atomic_write_bytes(f"gs://{BUCKET}/hf/bin/pytorch_model.bin", (tmp_path / "pytorch_model.bin").read_bytes())
    got = pretrained.read_hf_state_dict(f"gs://{BUCKET}/hf/bin")
    assert sorted(got) == sorted(weights) and all(np.array_equal(got[k], weights[k]) for k in weights)
