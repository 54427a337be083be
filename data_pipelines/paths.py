"""Local and remote (`gs://`, any fsspec URL) paths through `etils.epath`, the path type Orbax uses.

    as_path(p)                 epath.Path of a local path or URL ("gs://bucket/run"); URLs are never abspath'ed
    is_remote(p)               True for URLs ("gs://", "s3://", ...), False for local paths
    display(p)                 a string for messages and configs: absolute for local paths, the URL otherwise
    atomic_write_bytes/text    readers never see a half-written file (local: temp + rename; GCS: an object
                               upload only becomes visible when complete, so it is written directly)
    read_bytes/read_text       with a clear error naming the path
    removed_on_failure(dir)    a command's output directory, locked while it writes; what a failing command wrote
                               into a new or empty directory is removed again (nothing half-made is left)
    local_copy(p, sha256=)     a local file with the contents of `p`: `p` itself if local, else a cached download
                               (`$XLGEN_CACHE_DIR` or ~/.cache/xlgen), verified against `sha256` when given

`gs://` needs `gcsfs` (`pip install 'xlgen[gcs]'`); on a TPU VM credentials come from the VM's service account.
URLs always go through fsspec (gcsfs), whether or not TensorFlow is installed: etils.epath would otherwise switch
to `tf.io.gfile` as soon as TensorFlow is importable (the `tf` extra), a second GCS client with its own
credentials and endpoint handling (it ignores `STORAGE_EMULATOR_HOST`). `EPATH_USE_TF=1` set by the user opts
back into tf.io.gfile.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import uuid

# etils reads this once, on the first URL it resolves (set before any epath.Path is used, so also for Orbax's).
os.environ.setdefault("EPATH_USE_TF", "false")

from etils import epath  # noqa: E402


def is_remote(path) -> bool:
    s = os.fspath(path) if not isinstance(path, epath.Path) else str(path)
    return "://" in s and not s.startswith("file://")


def as_path(path) -> epath.Path:
    """An epath.Path; local paths are made absolute (as before), URLs are left as they are."""
    if isinstance(path, epath.Path):
        return path if is_remote(path) else epath.Path(os.path.abspath(os.fspath(path)))
    s = os.fspath(path)
    if s.startswith("file://"):
        s = s[len("file://") :]
    return epath.Path(s) if is_remote(s) else epath.Path(os.path.abspath(s))


def display(path) -> str:
    return str(as_path(path))


def join(path, *parts) -> str:
    """`os.path.join` that keeps URLs intact; returns a str (for configs and messages)."""
    return str(as_path(path).joinpath(*parts))


def read_bytes(path) -> bytes:
    p = as_path(path)
    try:
        return p.read_bytes()
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{p}: no such file") from e
    except OSError as e:
        raise OSError(f"{p}: cannot read ({e})") from e


def read_text(path, encoding: str = "utf-8") -> str:
    return read_bytes(path).decode(encoding)


def atomic_write_bytes(path, data: bytes) -> None:
    """Write `data` to `path` so that readers see either the old or the new file, never a partial one: locally a
    temp file in the same directory (created if missing), fsync, rename; on object stores one upload (an object
    becomes visible only once complete). The one atomic-write helper of the code base."""
    p = as_path(path)
    if is_remote(p):
        p.write_bytes(data)
        return
    os.makedirs(os.path.dirname(os.path.abspath(p)), exist_ok=True)
    tmp = f"{p}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path, text: str, encoding: str = "utf-8") -> None:
    atomic_write_bytes(path, text.encode(encoding))


def atomic_write_figure(path, fig, **savefig_kwargs) -> None:
    """A matplotlib figure written atomically to `path` (its format from the suffix), replacing any old file."""
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format=os.path.splitext(str(path))[1].lstrip(".") or "png", **savefig_kwargs)
    atomic_write_bytes(path, buf.getvalue())


def write_json_atomic(path, obj) -> None:
    """`obj` as indented, key-sorted JSON (+ newline), written atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def makedirs(path) -> None:
    """mkdir -p; a no-op on object stores without directories."""
    as_path(path).mkdir(parents=True, exist_ok=True)


class OutputBusy(ValueError):
    """Another process is writing into the output directory (`removed_on_failure`'s lock): a one-line error."""


def make_dirs(path) -> list:
    """mkdir -p `path`; the directories this call created, outermost first (each by an atomic `mkdir`: of two
    processes creating the same directory exactly one creates it)."""
    missing = []
    p = os.path.abspath(path)
    while not os.path.exists(p):
        missing.append(p)
        p = os.path.dirname(p)
    made: list = []
    try:
        for d in reversed(missing):
            try:
                os.mkdir(d)
                made.append(d)
            except FileExistsError:
                if not os.path.isdir(d):
                    raise
    except BaseException:
        remove_empty(made)
        raise
    return made


def remove_empty(made) -> None:
    """Remove the directories of `made` (innermost first) that are empty: never what another process put there."""
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError:
            return


@contextlib.contextmanager
def removed_on_failure(path, keep=()):
    """Run a command that writes into the directory `path` (created here) while holding its lock: `flock` on the
    directory itself (no lock file; the kernel drops it when the process dies), so a second command writing into
    the same directory fails at once (OutputBusy, nothing changed). If the directory was absent or empty when
    this call took the lock and the command fails (any exception, Ctrl-C included), what it wrote is removed
    again — the directory and the parents this call created, else the directory's entries — unless it holds one
    of `keep` (e.g. a checkpoint: a run that got that far is resumable, not half-made). Only the lock holder
    cleans up, so a command that lost a race for a new directory never removes the winner's output. URLs: no
    lock, no clean-up."""
    import fcntl

    if is_remote(path):
        yield
        return
    full = os.path.abspath(path)
    made = make_dirs(full)
    try:
        fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        remove_empty(made)
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)  # the holder took the directory: nothing here is this command's to remove
        raise OutputBusy(
            f"{full}: another xlgen process is writing into this directory; wait for it to finish or give "
            "another output"
        ) from None
    try:
        fresh = not os.listdir(full)
        try:
            yield
        except BaseException:
            if fresh and not any(os.path.lexists(os.path.join(full, k)) for k in keep):
                if made and made[-1] == full:
                    shutil.rmtree(full, ignore_errors=True)
                    remove_empty(made[:-1])  # the parents this call made, unless another command uses them
                else:
                    for name in os.listdir(full):
                        p = os.path.join(full, name)
                        with contextlib.suppress(OSError):
                            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.remove(p)
            raise
    finally:
        os.close(fd)


def cache_dir(*parts: str) -> str:
    root = os.environ.get("XLGEN_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "xlgen")
    d = os.path.join(root, *parts)
    os.makedirs(d, exist_ok=True)
    return d


def sha256_of(path) -> str:
    h = hashlib.sha256()
    with as_path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def local_copy(path, *, sha256: str | None = None, key: str | None = None, subdir: str = "files") -> str:
    """A local file path with the contents of `path` (for memory-mapping, or libraries that need a file name).

    Local paths are returned as they are. Remote files are downloaded once into `cache_dir(subdir)` under
    `<sha256><suffix>` (or `<key><suffix>`, or a hash of the URL), to a temporary name then renamed, so
    concurrent processes on one host are safe. With `sha256`, the download (and any cached copy) is verified.
    """
    p = as_path(path)
    if not is_remote(p):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such file")
        return str(p)
    suffix = "".join(p.suffixes[-1:])
    name = sha256 or key or hashlib.sha256(str(p).encode()).hexdigest()
    dst = os.path.join(cache_dir(subdir), f"{name}{suffix}")
    if os.path.exists(dst) and (sha256 is not None or key is not None):
        return dst  # content-addressed: verified when it was written
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such file")
    tmp = f"{dst}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    h = hashlib.sha256()
    try:
        with p.open("rb") as src, open(tmp, "wb") as out:
            for chunk in iter(lambda: src.read(1 << 22), b""):
                h.update(chunk)
                out.write(chunk)
        if sha256 is not None and h.hexdigest() != sha256:
            raise ValueError(
                f"{p}: sha256 {h.hexdigest()[:12]} does not match the expected {sha256[:12]} "
                "(the file changed after its manifest was written)"
            )
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dst


def _walk_files(p: epath.Path):
    """Every file below `p` (epath's gs:// glob refuses `**`)."""
    for child in sorted(p.iterdir(), key=str):
        if child.is_dir():
            yield from _walk_files(child)
        else:
            yield child


def local_dir_copy(path, *, subdir: str = "dirs") -> str:
    """A local directory with the files under `path`: `path` itself if local, else a mirror in
    `cache_dir(subdir, <hash of the URL>)`, refreshed file by file (a file is downloaded again when it is missing
    or its size changed; each download goes to a temporary name and is renamed)."""
    p = as_path(path)
    if not is_remote(p):
        return str(p)
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such directory")
    root = cache_dir(subdir, hashlib.sha256(str(p).encode()).hexdigest()[:16])
    base = str(p).rstrip("/") + "/"
    for f in _walk_files(p):
        rel = str(f)[len(base) :]
        dst = os.path.join(root, *rel.split("/"))
        size = f.stat().length
        if os.path.exists(dst) and os.path.getsize(dst) == size:
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        tmp = f"{dst}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with f.open("rb") as src, open(tmp, "wb") as out:
                for chunk in iter(lambda: src.read(1 << 22), b""):
                    out.write(chunk)
            os.replace(tmp, dst)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
    return root
