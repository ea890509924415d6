"""`download` (download.py) against a stand-in hub on 127.0.0.1 (hub_standin.py) serving the
`release-files --preset tiny` files in the hub's layout, and `export --released` of what it fetched.

Every download runs as the user runs it: `python -m unstep_export download` in a subprocess, with
HF_ENDPOINT at the stand-in and HF_HOME in a temporary folder, and with torch and numpy made
unimportable, so that a download path that needs them fails here."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from helpers import cli_fails
from hub_standin import StandInHub
from unstep_export.__main__ import main
from unstep_export.config import preset
from unstep_export.download import partial_name
from unstep_export.layout import RELEASED, SELF_FORCING_REPO, WAN_REPO
from unstep_export.release import release_files

EXPORT_DIR = Path(__file__).resolve().parents[1]
TOKENIZER = EXPORT_DIR.parents[0] / "tokenizer" / "tokenizer.json"
TEXT = next(f for f in RELEASED if f.part == "text")
DIT = next(f for f in RELEASED if f.part == "dit")
TOK = next(f for f in RELEASED if f.part == "tokenizer")

# Runs the CLI with torch and numpy unimportable (an import of either raises ImportError).
REFUSING = """
import sys

class RefuseHeavy:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("torch", "numpy"):
            raise ImportError(f"{name} is not importable here")
        return None

sys.meta_path.insert(0, RefuseHeavy())
from unstep_export.__main__ import main
main(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The tiny released-format files, as the stand-in serves them."""
    d = tmp_path_factory.mktemp("served")
    release_files(preset("tiny"), d, tokenizer=TOKENIZER)
    return d


@pytest.fixture
def hub(served):
    with StandInHub({(f.repo, f.path): f.local(served) for f in RELEASED}) as h:
        yield h


def run(args, hub_or_endpoint, home: Path, cwd: Path | None = None, **env):
    endpoint = getattr(hub_or_endpoint, "endpoint", hub_or_endpoint)
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    e = {**base, "PYTHONPATH": str(EXPORT_DIR), "HF_ENDPOINT": endpoint, "HF_HOME": str(home / "hf-home"),
         "HF_HUB_DISABLE_PROGRESS_BARS": "1", **env}
    return subprocess.run([sys.executable, "-c", REFUSING, *args], env=e, capture_output=True, text=True, timeout=120,
                          cwd=cwd)


def download(out: Path, hub, home: Path, *extra, **env):
    return run(["download", "--out", str(out), *extra], hub, home, **env)


def same_files(a: Path, b: Path):
    for f in RELEASED:
        assert f.local(a).read_bytes() == f.local(b).read_bytes(), f.relative()


# ---------------------------------------------------------------------------------------------
# (a) the files, then a bundle from them
# ---------------------------------------------------------------------------------------------

def test_download_then_export_released(served, hub, tmp_path):
    out = tmp_path / "released"
    r = download(out, hub, tmp_path)
    assert r.returncode == 0, r.stderr
    same_files(out, served)
    for i, f in enumerate(RELEASED, 1):
        assert f"[{i}/4] {f.repo} {f.path}" in r.stdout
    assert f"export --released {out}" in r.stdout
    # The large files' bytes came from the other host, without the token.
    lfs = hub.requests("GET", "/lfs/")
    assert len(lfs) == 3 and all(q.host == "localhost" and not q.authorized for q in lfs)

    # Run again: every file is complete, so only HEAD requests.
    hub.log.clear()
    r = download(out, hub, tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("already complete") == 4
    assert hub.requests("HEAD") and not hub.requests("GET", "/resolve/") and not hub.requests("GET", "/lfs/")

    # export --released of the fetched folder == export of the served files given one by one.
    a, b = tmp_path / "from-released", tmp_path / "from-files"
    fast = ["--preset", "tiny", "--no-fused-dit", "--no-fused-vae"]
    main(["export", *fast, "--out", str(a), "--released", str(out)])
    main(["export", *fast, "--out", str(b), "--self-forcing", str(DIT.local(served)), "--ema",
          "--wan-dir", str(served / "Wan2.1-T2V-1.3B")])
    ta, tb = (tomllib.loads((d / "bundle.toml").read_text()) for d in (a, b))
    assert ta["files"] == tb["files"] and ta["weights"] == tb["weights"]
    assert ta["weights"]["dit"]["entry"] == "generator_ema"
    assert ta["weights"]["text_encoder"]["source"] == "released"


# ---------------------------------------------------------------------------------------------
# (b) an interrupted transfer continues where it stopped
# ---------------------------------------------------------------------------------------------

def test_interrupted_download_resumes(served, tmp_path):
    """The text encoder's place holds a file of 24 MB here: huggingface_hub writes what it receives
    in chunks of 10 MB, and a chunk that a broken connection cuts short is lost, so a transfer cut
    after 17 MB keeps 10 MB."""
    big = tmp_path / "big.pth"
    big.write_bytes(b"PK\x03\x04" + bytes(range(256)) * (24 * 4096))  # a zip's magic, as torch.save writes
    size = big.stat().st_size
    files = {(f.repo, f.path): f.local(served) for f in RELEASED}
    with StandInHub({**files, (TEXT.repo, TEXT.path): big}) as hub:
        out = tmp_path / "released"
        cut = 17 * 2**20 + 123
        hub.cut[(TEXT.repo, TEXT.path)] = cut
        r = download(out, hub, tmp_path)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"error: failed to fetch {TEXT.repo} {TEXT.path}: the connection broke" in r.stderr
        assert "hint: run the same command again" in r.stderr
        assert not TEXT.local(out).exists()
        # The other files are complete; the cut one is kept partial.
        for f in RELEASED:
            if f is not TEXT:
                assert f.local(out).read_bytes() == f.local(served).read_bytes()
        parts = list((out / TEXT.folder).rglob(f"{Path(TEXT.path).name}.*.part"))
        assert len(parts) == 1
        kept = parts[0].stat().st_size
        assert 0 < kept <= cut and f"{kept} bytes kept in {parts[0]}" in r.stdout

        del hub.cut[(TEXT.repo, TEXT.path)]
        hub.log.clear()
        r = download(out, hub, tmp_path)
        assert r.returncode == 0, r.stderr
        assert f"resuming at {kept} of" in r.stdout
        assert TEXT.local(out).read_bytes() == big.read_bytes()
        # One request for the rest of the file, and no other file fetched again.
        gets = hub.requests("GET")
        assert [(q.path, q.range, q.sent) for q in gets if "/api/" not in q.path] == \
            [(f"/lfs/{hub.files[(TEXT.repo, TEXT.path)].sha256}", f"bytes={kept}-", size - kept)]
        assert not parts[0].exists()


# ---------------------------------------------------------------------------------------------
# (c) the hub's refusals and an unreachable hub: the file, the reason and what to do
# ---------------------------------------------------------------------------------------------

def test_missing_file_is_named(hub, tmp_path):
    hub.missing.add((TOK.repo, TOK.path))
    r = download(tmp_path / "released", hub, tmp_path)
    assert r.returncode == 1
    assert f"error: failed to fetch {WAN_REPO} {TOK.path}: {WAN_REPO} has no file {TOK.path} at revision 'main' " \
           "(HTTP 404" in r.stderr
    assert f"hint: HF_ENDPOINT is {hub.endpoint}" in r.stderr
    # One missing file does not stop the others.
    assert r.stdout.count("done (") == 3


def test_gated_repository_wants_hf_token(served, hub, tmp_path):
    hub.tokens[SELF_FORCING_REPO] = "tok-123"
    out = tmp_path / "released"
    r = download(out, hub, tmp_path)
    assert r.returncode == 1
    assert f"error: failed to fetch {SELF_FORCING_REPO} {DIT.path}: {SELF_FORCING_REPO} is gated" in r.stderr
    assert "HTTP 401" in r.stderr and "hint: set HF_TOKEN" in r.stderr

    hub.log.clear()
    r = download(out, hub, tmp_path, HF_TOKEN="tok-123")
    assert r.returncode == 0, r.stderr
    same_files(out, served)
    (head,) = hub.requests("HEAD", SELF_FORCING_REPO)
    (get,) = hub.requests("GET", "/lfs/")
    assert head.authorized and not get.authorized


def test_unknown_revision(hub, tmp_path):
    r = download(tmp_path / "released", hub, tmp_path, "--wan-revision", "v9")
    assert r.returncode == 1
    assert f"error: failed to fetch {WAN_REPO} Wan2.1_VAE.pth: {WAN_REPO} has no revision 'v9'" in r.stderr
    assert f"[1/4] {SELF_FORCING_REPO} {DIT.path} ->" in r.stdout and "done (" in r.stdout


def test_unreachable_hub(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    r = download(tmp_path / "released", closed, tmp_path)
    assert r.returncode == 1
    assert f"error: failed to fetch {SELF_FORCING_REPO} {DIT.path}: cannot reach {closed}" in r.stderr
    assert "set HF_ENDPOINT to a reachable mirror" in r.stderr
    assert f"{WAN_REPO} {TOK.path} (not tried)" in r.stderr


def test_bad_out_is_exit_2(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("")
    r = download(f, "http://127.0.0.1:9", tmp_path)
    assert r.returncode == 2
    assert f"--out {f} is a file, not a directory" in r.stderr and "hint: give a directory" in r.stderr


def test_empty_out_is_exit_2(tmp_path):
    """An empty --out would be the current folder without saying so."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    r = run(["download", "--out", ""], "http://127.0.0.1:9", tmp_path, cwd=cwd)
    assert r.returncode == 2, r.stdout + r.stderr
    assert 'error: failed to use --out "": the path is empty' in r.stderr
    assert "hint: give a directory for the released files" in r.stderr
    assert list(cwd.iterdir()) == []


def test_offline(served, hub, tmp_path):
    out = tmp_path / "released"
    r = download(out, hub, tmp_path, HF_HUB_OFFLINE="1")
    assert r.returncode == 1 and "HF_HUB_OFFLINE is set and" in r.stderr and "not there" in r.stderr
    assert download(out, hub, tmp_path).returncode == 0
    hub.log.clear()
    r = download(out, hub, tmp_path, HF_HUB_OFFLINE="1")
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("HF_HUB_OFFLINE is set, so not compared") == 4 and not hub.log
    assert r.stdout.count("hash checked against the download's record") == 4


@pytest.mark.parametrize("part", ["tokenizer", "dit"])
def test_offline_checks_each_file_against_its_download(served, hub, tmp_path, part):
    """HF_HUB_OFFLINE does not take a file for the download's merely because it is there: one
    changed in place (its time set back, so that huggingface_hub's record still looks current),
    and one the download never recorded, are each an error naming the file."""
    f = next(g for g in RELEASED if g.part == part)
    out = tmp_path / "released"
    assert download(out, hub, tmp_path).returncode == 0
    dest = f.local(out)
    st = dest.stat()
    data = bytearray(dest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    dest.write_bytes(bytes(data))
    os.utime(dest, ns=(st.st_atime_ns, st.st_mtime_ns))
    r = download(out, hub, tmp_path, HF_HUB_OFFLINE="1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"{dest} is not the file the download recorded" in r.stderr
    assert r.stdout.count("hash checked against the download's record") == 3

    copied = tmp_path / "copied"
    shutil.copytree(served, copied)
    r = download(copied, hub, tmp_path, HF_HUB_OFFLINE="1")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stderr.count("has no record of a download") == 4


def test_a_small_file_is_fetched_whole_and_checked(served, hub, tmp_path):
    """A file kept in git (its ETag a git blob id) is never continued from a partial file, which
    may hold another version's bytes under the same ETag: it is fetched whole and its blob id
    checked; bytes that do not hash to the ETag are refused."""
    out = tmp_path / "released"
    served_tok = hub.files[(TOK.repo, TOK.path)]
    meta_dir = out / TOK.folder / ".cache" / "huggingface" / "download" / Path(TOK.path).parent
    meta_dir.mkdir(parents=True)
    (meta_dir / partial_name(Path(TOK.path).name, served_tok.blob)).write_bytes(b"another version's bytes")
    r = download(out, hub, tmp_path)
    assert r.returncode == 0, r.stderr
    assert TOK.local(out).read_bytes() == TOK.local(served).read_bytes()
    assert "git blob id checked" in r.stdout
    tok_gets = hub.requests("GET", f"/resolve/main/{TOK.path}")
    assert tok_gets and all(q.range is None for q in tok_gets)

    hub.etags[(TOK.repo, TOK.path)] = "0" * 40
    other = tmp_path / "other"
    r = download(other, hub, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"failed to fetch {TOK.repo} {TOK.path}: the bytes received have git blob id {served_tok.blob}" in r.stderr
    assert not TOK.local(other).exists()


def test_a_stalled_transfer_fails_saying_a_rerun_continues(served, hub, tmp_path):
    """A transfer that trickles (a byte every half second: no read ever times out) fails after
    UNSTEP_DOWNLOAD_STALL_SECONDS without a MiB, saying so and that running again continues; the
    other files are fetched, and the next run completes."""
    hub.trickle[(TOK.repo, TOK.path)] = 0.5
    out = tmp_path / "released"
    started = time.monotonic()
    r = download(out, hub, tmp_path, UNSTEP_DOWNLOAD_STALL_SECONDS="2")
    assert r.returncode == 1, r.stdout + r.stderr
    assert time.monotonic() - started < 60
    assert f"error: failed to fetch {TOK.repo} {TOK.path}: the transfer stalled: less than a MiB arrived in" \
        in r.stderr
    assert "hint: run the same command again" in r.stderr
    for f in RELEASED:
        if f is not TOK:
            assert f.local(out).read_bytes() == f.local(served).read_bytes()
    del hub.trickle[(TOK.repo, TOK.path)]
    r = download(out, hub, tmp_path)
    assert r.returncode == 0, r.stderr
    assert TOK.local(out).read_bytes() == TOK.local(served).read_bytes()

    r = download(tmp_path / "bad", hub, tmp_path, UNSTEP_DOWNLOAD_STALL_SECONDS="soon")
    assert r.returncode == 2 and "UNSTEP_DOWNLOAD_STALL_SECONDS='soon' is not a number" in r.stderr


# ---------------------------------------------------------------------------------------------
# (d) the download path imports neither torch nor numpy
# ---------------------------------------------------------------------------------------------

def test_download_path_does_not_import_torch(hub, tmp_path):
    r = download(tmp_path / "released", hub, tmp_path)
    assert r.returncode == 0, r.stderr
    # The same refusal stops a command that needs torch, so it does bite.
    r = run(["export", "--out", str(tmp_path / "b")], hub, tmp_path)
    assert r.returncode != 0 and "torch is not importable here" in r.stderr


# ---------------------------------------------------------------------------------------------
# export --released: refusals
# ---------------------------------------------------------------------------------------------

def test_released_folder_lacking_a_file(served, tmp_path, capsys):
    d = tmp_path / "partial"
    for f in RELEASED:
        if f is not TEXT:
            f.local(d).parent.mkdir(parents=True, exist_ok=True)
            f.local(d).write_bytes(f.local(served).read_bytes())
    out = tmp_path / "b"
    cli_fails(capsys, ["export", "--preset", "tiny", "--released", str(d), "--out", str(out)],
              f"--released {d}: {TEXT.relative()} not found there",
              f"python -m unstep_export download --out {d}")
    assert not out.exists()
    cli_fails(capsys, ["export", "--released", str(tmp_path / "nowhere"), "--out", str(out)],
              "no such directory", "download --out")


@pytest.mark.parametrize("other", [["--wan-dir", "W"], ["--self-forcing", "S"], ["--checkpoint", "C"],
                                   ["--tokenizer", "T"], ["--text-checkpoint", "X", "--vae-checkpoint", "V"]])
def test_released_conflicts_with_file_options(served, tmp_path, capsys, other):
    flags = " and ".join(o for o in other if o.startswith("--"))
    cli_fails(capsys, ["export", "--preset", "tiny", "--released", str(served), *other, "--out", str(tmp_path / "b")],
              f"{flags} would name", "give either --released or the files one by one")


def test_released_defaults_to_the_wan_preset(served, tmp_path, capsys):
    cli_fails(capsys, ["export", "--released", str(served), "--out", str(tmp_path / "b")],
              "the preset wan-1.3b expects dim 1536")


# ---------------------------------------------------------------------------------------------
# (e) nothing the hub sends becomes a path, and no symbolic link is written through
# ---------------------------------------------------------------------------------------------

def _tree(root: Path, leave_out: tuple = ()) -> set:
    """Every path below `root` (symbolic links as themselves), but those below `leave_out`."""
    return {p for p in root.rglob("*") if not any(p == x or x in p.parents for x in leave_out)}


@pytest.mark.parametrize("shape", ["climbs", "slashes", "dots"])
def test_an_etag_never_becomes_a_path(served, hub, tmp_path, shape):
    """A hub (or anything on the way) that sends an ETag holding `/` or `..`: the partial file and
    its lock are named by a hash of it, so nothing is made outside --out and no folder is named
    after it, on the run that is cut and on the run that resumes."""
    work = tmp_path / "work"
    out = work / "out"
    for f in (TOK, DIT):
        partial_dir = out / f.folder / ".cache" / "huggingface" / "download" / Path(f.path).parent
        # "x/.." cancels itself; then one ".." per folder from the partial's folder up to `work`.
        climb = "/.." * len(partial_dir.relative_to(work).parts)
        hub.etags[(f.repo, f.path)] = {"climbs": f"x/..{climb}/escaped", "slashes": "a/b/c", "dots": "../.."}[shape]
    before = _tree(tmp_path)
    hub.cut[(TOK.repo, TOK.path)] = 10
    r = download(out, hub, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    del hub.cut[(TOK.repo, TOK.path)]
    r = download(out, hub, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    same_files(out, served)
    made_outside = _tree(tmp_path, (out, tmp_path / "hf-home")) - before - {work, out}
    assert made_outside == set()
    # Below --out: the files, their records and locks, and no folder or file named after the ETag.
    for f in (TOK, DIT):
        name = re.escape(Path(f.path).name)
        own = re.compile(rf"{name}(\.metadata|\.lock|\.[0-9a-f]{{32}}\.part\.lock)?")
        for p in _tree(out):
            assert p.resolve().is_relative_to(out.resolve()), p
            assert not p.name.startswith(Path(f.path).name) or own.fullmatch(p.name), p
            assert "escaped" not in p.name and p.name not in ("a", "b", "c"), p


def _cut_then_plant_link(hub, out: Path, tmp_path: Path, suffix: str) -> tuple[Path, Path]:
    """A download of the tokenizer cut short, which leaves its partial file; then a symbolic link
    at the partial's path plus `suffix` (`""`: the partial itself; `".lock"`: its lock) to a
    file outside --out.  Returns the link and the file it points to."""
    hub.cut[(TOK.repo, TOK.path)] = 10
    r = download(out, hub, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    del hub.cut[(TOK.repo, TOK.path)]
    (part,) = (out / TOK.folder).rglob(f"{Path(TOK.path).name}.*.part")
    victim = tmp_path / "victim"
    victim.write_bytes(b"not the hub's to write")
    link = part.with_name(part.name + suffix)
    link.unlink(missing_ok=True)
    link.symlink_to(victim)
    return link, victim


@pytest.mark.parametrize("suffix", ["", ".lock"], ids=["partial", "lock"])
def test_a_link_at_the_partial_file_is_not_written_through(hub, tmp_path, suffix):
    out = tmp_path / "released"
    link, victim = _cut_then_plant_link(hub, out, tmp_path, suffix)
    r = download(out, hub, tmp_path)
    assert victim.read_bytes() == b"not the hub's to write"
    assert link.is_symlink()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"error: failed to fetch {TOK.repo} {TOK.path}: {link} is a symbolic link" in r.stderr
    assert f"hint: remove the link (rm '{link}') and run the same command again" in r.stderr
    assert not TOK.local(out).exists()
    # The other files, fetched by the cut run, are kept; with the link gone, the tokenizer is fetched.
    assert r.stdout.count("already complete") == 3
    link.unlink()
    r = download(out, hub, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert victim.read_bytes() == b"not the hub's to write"


@pytest.mark.parametrize("part", ["dit", "tokenizer"])
def test_a_page_served_in_place_of_a_file_is_never_kept(served, tmp_path, part):
    """Something between here and the hub (a captive portal, a proxy) answers a file with its own
    page and an ETag that is neither a sha256 nor a git blob id, so no hash can check the bytes:
    the file's format can, and the page is refused, removed and never recorded."""
    f = next(g for g in RELEASED if g.part == part)
    page = tmp_path / "portal.html"
    page.write_bytes(b"<!DOCTYPE html><html><body>Log in to use this network</body></html>\n")
    files = {(g.repo, g.path): g.local(served) for g in RELEASED}
    files[(f.repo, f.path)] = page
    out = tmp_path / "released"
    with StandInHub(files) as h:
        h.etags[(f.repo, f.path)] = "portal-1"
        r = download(out, h, tmp_path)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"failed to fetch {f.repo} {f.path}: the bytes received are not" in r.stderr
    assert "start with '<!DOCTYPE html>" in r.stderr
    assert not f.local(out).exists()
    assert not list((out / f.folder).rglob(f"{Path(f.path).name}.*.part"))
    assert not list((out / f.folder).rglob(f"{Path(f.path).name}.metadata"))
    # The other files came whole.
    for g in RELEASED:
        if g != f:
            assert g.local(out).read_bytes() == g.local(served).read_bytes(), g.relative()
