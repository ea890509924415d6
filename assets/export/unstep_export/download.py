"""`download`: the released files the exporter reads (layout.py) from the model hub into a released
folder, with huggingface_hub and the standard library only.  No torch or numpy: it runs where
neither is installed, such as a cluster's login node.

The hub is huggingface_hub's to find and talk to: HF_ENDPOINT (the hub or a mirror), HF_TOKEN or
the token `hf auth login` saved under HF_HOME, HF_HUB_OFFLINE, proxies.  Per file:

1. A HEAD request (huggingface_hub's get_hf_file_metadata) gives its ETag, size, commit and the
   address of its bytes (for a large file a signed address off the hub, which gets no token).
2. A file already at its place is kept when huggingface_hub's record of a local-folder download
   (`.cache/huggingface/download/<path>.metadata`, which hf_hub_download(local_dir=...) writes and
   reads too) has the same ETag, or, without a record, when its sha256 is the ETag of an LFS file.
3. Otherwise its bytes go into `<name>.<sha256 of the ETag>.part` beside that record (nothing the
   hub sends becomes part of a path).  A large (LFS) file's partial file is continued by a later
   run with a Range request: hf_hub_download writes into a file unique to its process and deletes
   it when the transfer fails, so an interrupted 11 GB text encoder would start over.  A small file
   kept in git (`tokenizer.json`) is fetched whole every time: its ETag is the git blob id, which
   is checked once it is there, and bytes of another version are never continued.  The transfer
   is huggingface_hub's http_get (which also retries a broken connection from where it stopped,
   within one run), watched for stalls: when no MiB arrives for STALL_SECONDS
   (UNSTEP_DOWNLOAD_STALL_SECONDS) the file fails, saying that running again continues it.  The
   file is then checked (its size, its sha256 or git blob id against the ETag, and its format: a
   checkpoint must be torch.save's zip archive and tokenizer.json a JSON tokenizer, so that a
   captive portal's page is never taken for the file whatever ETag came with it), moved into
   place and recorded as hf_hub_download records it.  The partial file and its lock are opened
   without following symbolic links: a link planted at either is refused, never written through.

With HF_HUB_OFFLINE set nothing is asked of the network: each file must be there, recorded by an
earlier download and unchanged since (its sha256, or git blob id, is the ETag that download
recorded), or that is an error.  A file that fails does not stop the others; the command then
exits 1 (2 for a bad --out).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

from .layout import RELEASED, SELF_FORCING_REPO, WAN_REPO, ReleasedFile

BAD_INPUT, FAILED = 2, 1
SHA256 = re.compile(r"^[0-9a-f]{64}$")
GIT_BLOB = re.compile(r"^[0-9a-f]{40}$")
REVISION = "main"
# A transfer that brings less than a MiB (the size it is written in, CHUNK) in this many seconds
# has stalled; UNSTEP_DOWNLOAD_STALL_SECONDS sets another limit.
STALL_SECONDS = 120
CHUNK = 1 << 20


class DownloadError(Exception):
    """Why a file could not be fetched: `reason` (a fragment after "failed to fetch ..."),
    `hint` (what to do, or None) and the exit status (1 for the hub's or the network's answer,
    2 for bad input).  `unreachable`: the hub cannot be reached at all, so the other files are
    not tried."""

    def __init__(self, reason: str, hint: str | None = None, status: int = FAILED, unreachable: bool = False):
        super().__init__(reason)
        self.reason, self.hint, self.status, self.unreachable = reason, hint, status, unreachable


def _size(n) -> str:
    if n is None:
        return "size unknown"
    return f"{n} bytes" if n < 1_000_000 else f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def _git_blob_id(path: Path) -> str:
    """git's id of the file's bytes as a blob: the ETag the hub gives a file kept in git."""
    size = os.stat(path, follow_symlinks=False).st_size
    h = hashlib.sha1(b"blob %d\0" % size)
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "rb") as f:
        while block := f.read(1 << 24):
            h.update(block)
    return h.hexdigest()


def _matches_etag(path: Path, etag: str) -> bool | None:
    """Whether the file's bytes are those the ETag names (an LFS file's sha256, a git file's blob
    id); None for an ETag that names no hash."""
    if SHA256.fullmatch(etag):
        return _sha256(path) == etag
    if GIT_BLOB.fullmatch(etag):
        return _git_blob_id(path) == etag
    return None


def _stall_seconds() -> float:
    text = os.environ.get("UNSTEP_DOWNLOAD_STALL_SECONDS", "").strip()
    if not text:
        return STALL_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0
    if not 0 < seconds < 10**7:
        raise DownloadError(f"UNSTEP_DOWNLOAD_STALL_SECONDS={text!r} is not a number of seconds",
                            f"set it to a positive number of seconds, or unset it ({STALL_SECONDS})", BAD_INPUT)
    return seconds


class _Watched:
    """The partial file as http_get writes it, with the time of its last write: what the stall
    watch reads."""

    def __init__(self, out):
        self.out, self.last = out, time.monotonic()

    def write(self, data):
        n = self.out.write(data)
        self.last = time.monotonic()
        return n

    def __getattr__(self, name):
        return getattr(self.out, name)


@contextmanager
def _stall_watch(watched: _Watched, seconds: float):
    """Raises a DownloadError in this (the main) thread when `watched` has had no write for
    `seconds`: a transfer that trickles a byte every few seconds never times out a read, so the
    watch counts the MiBs it writes.  Off the main thread (where no signal handler can be set) the
    transfer is not watched."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def check(_signum, _frame):
        idle = time.monotonic() - watched.last
        if idle >= seconds:
            signal.setitimer(signal.ITIMER_REAL, 0)
            raise DownloadError(f"the transfer stalled: less than a MiB arrived in {idle:.0f} s",
                                "run the same command again: it continues from the bytes it has (a large file), "
                                "or fetches the file anew (a small one); UNSTEP_DOWNLOAD_STALL_SECONDS sets how long "
                                "a transfer may go without progress")

    previous = signal.signal(signal.SIGALRM, check)
    tick = min(1.0, seconds / 4)
    signal.setitimer(signal.ITIMER_REAL, tick, tick)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _names(e: BaseException) -> set:
    """The class names of an exception and its bases: huggingface_hub's HTTP client's errors are
    told apart by name, so that this module imports no HTTP library of its own."""
    return {c.__name__ for c in type(e).__mro__}


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def explain(e: BaseException, f: ReleasedFile, revision: str) -> DownloadError:
    """What a huggingface_hub or network error means for this file, with what to do."""
    if isinstance(e, DownloadError):
        return e
    names = _names(e)
    endpoint = _endpoint()
    token_hint = (f"set HF_TOKEN to a token of an account that can read {f.repo} (accept its terms on its page "
                  "first if it is gated), or log in with `hf auth login`; HF_ENDPOINT is " + endpoint)
    response = getattr(e, "response", None)
    status = getattr(response, "status_code", None)
    message = response.headers.get("X-Error-Message") if response is not None else None
    said = f"HTTP {status}" + (f": {message}" if message else "")
    if "GatedRepoError" in names:
        return DownloadError(f"{f.repo} is gated and this request is not allowed in ({said})", token_hint)
    if "RepositoryNotFoundError" in names:
        return DownloadError(f"repository {f.repo} not found, or not readable without a token ({said})", token_hint)
    if "RevisionNotFoundError" in names:
        return DownloadError(f"{f.repo} has no revision {revision!r} ({said})",
                             "give a branch, tag or commit of that repository, or leave the revision out (main)")
    if "RemoteEntryNotFoundError" in names or status == 404:
        return DownloadError(f"{f.repo} has no file {f.path} at revision {revision!r} ({said})",
                             f"HF_ENDPOINT is {endpoint}: a mirror there may lack the file; unset HF_ENDPOINT for "
                             "huggingface_hub's default hub")
    if status in (401, 403):
        return DownloadError(f"not allowed to read {f.repo} ({said})", token_hint)
    if status is not None:
        return DownloadError(f"the hub answered {said}",
                             "try again later" if status >= 500 or status == 429 else f"HF_ENDPOINT is {endpoint}")
    if "OfflineModeIsEnabled" in names:
        return DownloadError("HF_HUB_OFFLINE is set", "unset HF_HUB_OFFLINE to download")
    if names & {"ConnectError", "ConnectTimeout", "ProxyError", "UnsupportedProtocol"}:
        return DownloadError(f"cannot reach {endpoint}: {e}",
                             "check the network and proxy (HTTPS_PROXY), or set HF_ENDPOINT to a reachable mirror "
                             "of the hub (HF_HUB_OFFLINE=1 only checks the files already there)", unreachable=True)
    if names & {"RemoteProtocolError", "ReadError", "ReadTimeout", "TimeoutException", "NetworkError"}:
        return DownloadError(f"the connection broke: {e}",
                             "run the same command again: it continues from the bytes it has")
    if "FileMetadataError" in names:
        return DownloadError(f"{endpoint} does not answer like a hub: {e}".splitlines()[0],
                             "set HF_ENDPOINT to the hub or a mirror of it, or unset it")
    return DownloadError(f"{type(e).__name__}: {e}".splitlines()[0])


def prepare_out(out) -> Path:
    """The released folder, created; a path that cannot be one is bad input (exit 2).  An empty
    path is refused: it would mean the current folder without saying so."""
    if not str(out).strip():
        raise DownloadError("the path is empty", "give a directory for the released files (it is created if "
                            "missing), e.g. --out released", BAD_INPUT)
    root = Path(out).expanduser()
    if root.exists() and not root.is_dir():
        raise DownloadError(f"--out {root} is a file, not a directory",
                            "give a directory for the released files (it is created if missing)", BAD_INPUT)
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / ".unstep-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise DownloadError(f"--out {root}: cannot write there ({e.strerror or e})",
                            "give a directory you can write to", BAD_INPUT) from e
    return root.resolve()


def partial_name(dest_name: str, etag: str) -> str:
    """The partial file of one version (ETag) of the file `dest_name`: named by the sha256 of the
    ETag, so that nothing the hub sends becomes part of a path (an ETag may hold `/` or `..`)."""
    return f"{dest_name}.{hashlib.sha256(etag.encode()).hexdigest()[:32]}.part"


def _open_own(path: Path, flags: int) -> int:
    """Opens a file this module writes in its own folder, never through a symbolic link: a link
    there (planted, or made by something else) is refused, so no byte the hub sends is written
    where the link points."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise DownloadError(f"{path} is a symbolic link, not a file of this download, and is not followed",
                                f"remove the link (rm '{path}') and run the same command again") from e
        raise


@contextmanager
def _locked(path: Path, say):
    """Holds an exclusive lock (flock) on `path` for one writer of a partial file; the lock file is
    opened like the partial file (no symbolic link followed, never truncated)."""
    fd = _open_own(path, os.O_RDWR | os.O_CREAT)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"waiting for another download writing {path.name[:-len('.lock')]}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _record(local_dir: Path, f: ReleasedFile, commit: str, etag: str):
    """Records a complete file as hf_hub_download does; its record is not written through a
    symbolic link either."""
    from huggingface_hub._local_folder import get_local_download_paths, write_download_metadata

    record = get_local_download_paths(local_dir, f.path).metadata_path
    if record.is_symlink():
        raise DownloadError(f"{record} is a symbolic link, not a file of this download, and is not followed",
                            f"remove the link (rm '{record}') and run the same command again")
    write_download_metadata(local_dir=local_dir, filename=f.path, commit_hash=commit, etag=etag)


def _record_is_current(local_dir: Path, f: ReleasedFile, etag: str) -> bool:
    from huggingface_hub._local_folder import read_download_metadata

    record = read_download_metadata(local_dir, f.path)
    return record is not None and record.etag == etag


def fetch(f: ReleasedFile, root: Path, revision: str, say) -> str:
    """Brings one file into `root` (see the module's docstring); returns what was done."""
    from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
    from huggingface_hub._local_folder import get_local_download_paths
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    local_dir, dest = root / f.folder, f.local(root)
    if constants.is_offline_mode():
        if dest.is_file():
            return _check_offline(local_dir, f, dest)
        raise DownloadError(f"HF_HUB_OFFLINE is set and {dest} is not there", "unset HF_HUB_OFFLINE to download it")
    stall = _stall_seconds()

    url = hf_hub_url(f.repo, f.path, revision=revision)
    meta = get_hf_file_metadata(url)
    if meta.commit_hash is None or meta.etag is None:
        raise DownloadError(f"{_endpoint()} answered {url} without a commit and an ETag: not a hub",
                            "set HF_ENDPOINT to the hub or a mirror of it, or unset it")
    etag, size = meta.etag, meta.size
    lfs = bool(SHA256.fullmatch(etag))

    if dest.is_file() and (size is None or dest.stat().st_size == size):
        if _record_is_current(local_dir, f, etag):
            return f"already complete ({_size(dest.stat().st_size)})"
        if lfs and _sha256(dest) == etag:
            _record(local_dir, f, meta.commit_hash, etag)
            return f"already complete ({_size(dest.stat().st_size)}, sha256 checked)"

    paths = get_local_download_paths(local_dir, f.path)
    partial = paths.metadata_path.parent / partial_name(dest.name, etag)
    # A partial file of another version of the file cannot be continued.
    for stale in partial.parent.glob(f"{dest.name}.*.part"):
        if stale != partial:
            stale.unlink(missing_ok=True)
    headers = build_hf_headers()
    if urlsplit(meta.location).netloc != urlsplit(url).netloc:
        # A signed address off the hub: the token stays with the hub.
        headers.pop("authorization", None)

    with _locked(partial.with_name(partial.name + ".lock"), say), \
            os.fdopen(_open_own(partial, os.O_WRONLY | os.O_APPEND | os.O_CREAT), "ab") as out:
        have = os.fstat(out.fileno()).st_size
        # A file kept in git is small and may change under the same ETag: never continued.
        if (size is not None and have > size) or not lfs:
            out.truncate(0)
            have = 0
        free = shutil.disk_usage(partial.parent).free
        if size is not None and size - have > free:
            raise DownloadError(f"{_size(size - have)} to write, {_size(free)} free under {root}",
                                "make room there or give another --out", BAD_INPUT)
        say(f"resuming at {have} of {_size(size)}" if have else f"fetching {_size(size)}")
        watched = _Watched(out)
        try:
            with _chunks_of(CHUNK), _stall_watch(watched, stall):
                http_get(meta.location, watched, resume_size=have, headers=headers, expected_size=size,
                         displayed_filename=dest.name)
            out.flush()
        except BaseException:
            out.flush()
            kept = os.fstat(out.fileno()).st_size
            if kept:
                say(f"{kept} bytes kept in {partial}; the next run continues from there")
            raise
        got = os.fstat(out.fileno()).st_size
        if size is not None and got != size:
            raise DownloadError(f"got {got} bytes, the hub says {size}", "run the same command again")
        if lfs:
            digest = _sha256(partial)
            if digest != etag:
                partial.unlink()
                raise DownloadError(f"the bytes received have sha256 {digest}, the hub says {etag}; the partial "
                                    "file was removed", "run the same command again")
        elif GIT_BLOB.fullmatch(etag):
            blob = _git_blob_id(partial)
            if blob != etag:
                partial.unlink()
                raise DownloadError(f"the bytes received have git blob id {blob}, the hub's ETag is {etag}; the "
                                    "partial file was removed", "run the same command again")
        _check_format(f, partial)
        os.replace(partial, dest)
    _record(local_dir, f, meta.commit_hash, etag)
    checked = ", sha256 checked" if lfs else ", git blob id checked" if GIT_BLOB.fullmatch(etag) else ""
    return f"done ({_size(got)}{checked})"


# What each released file must be, whatever its ETag says: the checkpoints are torch.save's zip
# archives, the tokenizer a JSON object with a `model`.
ZIP_MAGIC = b"PK\x03\x04"


def _check_format(f: ReleasedFile, path: Path):
    """Refuses bytes that are not the released file's format: an ETag that is neither a sha256 nor
    a git blob id leaves them unchecked by hash, and a captive portal's or a proxy's page served
    under the file's name must never become weights.  The partial file is removed."""
    with open(path, "rb") as fh:
        head = fh.read(64 * 1024)
    if f.path.endswith((".pt", ".pth")):
        ok, what = head.startswith(ZIP_MAGIC), "a PyTorch checkpoint (a zip archive)"
    else:
        what = "a tokenizer.json (a JSON object with a \"model\")"
        try:
            ok = "model" in json.loads(path.read_bytes())
        except (ValueError, TypeError, UnicodeDecodeError):
            ok = False
    if not ok:
        path.unlink()
        start = head[:40].decode("utf-8", "replace").replace("\n", " ").strip()
        raise DownloadError(f"the bytes received are not {what}: they start with {start!r}, as a page from "
                            "something between here and the hub (a captive portal, a proxy) would; the partial "
                            "file was removed", "check the network connection (log in to the network if it asks), "
                            "then run the same command again")


@contextmanager
def _chunks_of(n: int):
    """huggingface_hub's http_get writes what it receives in pieces of DOWNLOAD_CHUNK_SIZE (10 MB):
    smaller pieces keep more of a cut transfer and let the stall watch see progress sooner."""
    from huggingface_hub import constants

    previous = constants.DOWNLOAD_CHUNK_SIZE
    constants.DOWNLOAD_CHUNK_SIZE = n
    try:
        yield
    finally:
        constants.DOWNLOAD_CHUNK_SIZE = previous


def _check_offline(local_dir: Path, f: ReleasedFile, dest: Path) -> str:
    """With HF_HUB_OFFLINE: the file at `dest` is the one an earlier download recorded: a record
    not older than the file, whose ETag its bytes hash to."""
    from huggingface_hub._local_folder import read_download_metadata

    record = read_download_metadata(local_dir, f.path)
    hint = "unset HF_HUB_OFFLINE to check it against the hub (and fetch it again if it differs)"
    if record is None or not record.etag:
        raise DownloadError(f"HF_HUB_OFFLINE is set and {dest} has no record of a download, or changed after it",
                            hint)
    if _matches_etag(dest, record.etag) is not True:
        raise DownloadError(f"HF_HUB_OFFLINE is set and {dest} is not the file the download recorded (its bytes do "
                            f"not hash to ETag {record.etag})", hint)
    return f"present ({_size(dest.stat().st_size)}, hash checked against the download's record; HF_HUB_OFFLINE is " \
           "set, so not compared with the hub)"


def download(out, revisions: dict | None = None, say=print, warn=None) -> int:
    """Fetches every file of layout.RELEASED into `out`; returns the exit status (0, 1 or 2).
    `revisions`: {repo: branch, tag or commit} (default main)."""
    warn = warn or (lambda line: print(line, file=sys.stderr))
    revisions = revisions or {}
    try:
        root = prepare_out(out)
        import huggingface_hub  # noqa: F401  (only to say clearly when it is missing)
    except DownloadError as e:
        _report(warn, f"failed to use --out {out}" if str(out) else 'failed to use --out ""', e)
        return e.status
    except ImportError as e:
        warn(f"error: failed to import huggingface_hub ({e})")
        warn("hint: pip install huggingface_hub")
        return BAD_INPUT
    failures, status = [], 0
    n = len(RELEASED)
    for i, f in enumerate(RELEASED, 1):
        revision = revisions.get(f.repo) or REVISION
        at = f" at {revision}" if revision != REVISION else ""
        say(f"[{i}/{n}] {f.repo} {f.path}{at} -> {f.local(root)}")
        try:
            done = fetch(f, root, revision, lambda line: say(f"      {line}"))
        except KeyboardInterrupt:
            warn(f"error: interrupted while fetching {f.repo} {f.path}; run the same command again to continue")
            return 130
        except Exception as e:  # noqa: BLE001  (every failure is reported with its file, then the next file)
            err = explain(e, f, revision)
            _report(warn, f"failed to fetch {f.repo} {f.path}", err)
            failures.append(f"{f.repo} {f.path}")
            status = max(status, err.status)
            if err.unreachable:
                failures += [f"{g.repo} {g.path} (not tried)" for g in RELEASED[i:]]
                break
            continue
        say(f"      {done}")
    if failures:
        warn(f"error: {len(failures)} of {n} files not fetched: {'; '.join(failures)}")
        return status
    say(f"all {n} files in {root}; a bundle from them: python -m unstep_export export --released {root} "
        "--out BUNDLE --device cuda")
    return 0


def _report(warn, what: str, e: DownloadError):
    warn(f"error: {what}: {e.reason}")
    if e.hint:
        warn(f"hint: {e.hint}")


def add_parser(sub):
    """The `download` subcommand's options."""
    import argparse

    p = sub.add_parser(
        "download", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="fetch the released weights (Self-Forcing's DiT, Wan2.1's VAE, UMT5 encoder and tokenizer) into the "
             "folder `export --released` reads; needs only huggingface_hub",
        description=(
            "Fetches the files the exporter reads, with huggingface_hub, into DIR:\n"
            + "".join(f"  {f.relative():52} {f.repo} {f.path}\n" for f in RELEASED)
            + "A file already complete there is kept; an interrupted run continues where it stopped when run\n"
            "again. Then: python -m unstep_export export --released DIR --out BUNDLE --device cuda\n\n"
            "Environment (read by huggingface_hub):\n"
            "  HF_ENDPOINT     the hub to ask (a mirror, or a stand-in in tests); default: huggingface_hub's\n"
            "  HF_TOKEN        an access token, for a gated or private repository (or `hf auth login`)\n"
            "  HF_HOME         huggingface_hub's folder, where `hf auth login` keeps the token\n"
            "  HF_HUB_OFFLINE  ask nothing: check every file in DIR against what its download recorded\n"
            "  UNSTEP_DOWNLOAD_STALL_SECONDS  how long a transfer may bring less than a MiB (default 120)\n"
            "  HF_HUB_DISABLE_PROGRESS_BARS  no byte-level progress bars\n\n"
            "Exit status: 0 every file there, 1 a file not fetched (the hub's or the network's answer),\n"
            "2 bad input (--out)."))
    p.add_argument("--out", required=True, metavar="DIR", help="the released folder (created if missing)")
    p.add_argument("--self-forcing-revision", metavar="REV", default=REVISION,
                   help=f"branch, tag or commit of {SELF_FORCING_REPO} (default {REVISION})")
    p.add_argument("--wan-revision", metavar="REV", default=REVISION,
                   help=f"branch, tag or commit of {WAN_REPO} (default {REVISION})")
    p.set_defaults(fn=cmd_download, threads=None)
    return p


def cmd_download(args):
    sys.exit(download(args.out, {SELF_FORCING_REPO: args.self_forcing_revision, WAN_REPO: args.wan_revision}))
