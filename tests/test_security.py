"""Secure by default: no unpickling or full ``torch.load`` unless asked for, no command the user
did not write, no file outside a converted folder, no credential in a message or a log."""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import PIL.Image
import pytest
import torch

import wdsx
from tests.fixtures.servers import RangeHTTPServer
from tests.fixtures.shards import tar_bytes, write_tar
from wdsx.commands import cli
from wdsx.core.redact import redact
from wdsx.stages.transforms import decode_pickle
from wdsx.write.convert import convert
from wdsx.write.partial import is_abandoned, remove_abandoned_partials

RAN: list[str] = []
"""Where the hostile pickle below records that it ran."""


def record(what: str) -> None:
    RAN.append(what)


class Hostile:
    """Unpickling this runs code: it calls :func:`record`."""

    def __reduce__(self) -> tuple:
        return (record, ("code ran while unpickling",))


class Custom:
    """A plain object in a ``.pth`` file: more than weights."""

    def __init__(self, value: int):
        self.value = value


def pth(value: object) -> bytes:
    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


@pytest.fixture(autouse=True)
def default_environment(monkeypatch):
    monkeypatch.delenv("WDSX_ALLOW_PICKLE", raising=False)
    monkeypatch.delenv("WDS_SECURE", raising=False)
    monkeypatch.delenv("WDS_PYTORCH_WEIGHTS_ONLY", raising=False)
    RAN.clear()


@pytest.fixture
def pickles(tmp_path):
    return write_tar(
        str(tmp_path / "pickles.tar"),
        [
            ("a.pyd", pickle.dumps(Hostile())),
            ("b.pickle", pickle.dumps(Hostile())),
            ("c.pkl", pickle.dumps(Hostile())),
        ],
    )


@pytest.mark.parametrize("stage", ["decode", "xdecode"])
def test_pickle_fields_are_not_unpickled_by_default(pickles, stage):
    dataset = wdsx.WebDataset(pickles, manifest=False)
    dataset = dataset.decode() if stage == "decode" else dataset.xdecode(**{"pickle": decode_pickle})
    with pytest.raises(Exception, match="WDSX_ALLOW_PICKLE") as caught:
        list(dataset)
    assert "pickle" in str(caught.value) and RAN == []


@pytest.mark.parametrize("stage", ["decode", "xdecode"])
def test_the_switch_allows_pickle_but_secure_mode_overrides_it(pickles, monkeypatch, stage):
    def decoded() -> list:
        dataset = wdsx.WebDataset(pickles, manifest=False)
        if stage == "decode":
            return list(dataset.decode())
        return list(dataset.xdecode(("*.pickle", decode_pickle), ("*.pkl", decode_pickle)))

    monkeypatch.setenv("WDSX_ALLOW_PICKLE", "1")
    assert len(decoded()) == 3 and len(RAN) == 3
    RAN.clear()
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(Exception, match="WDS_SECURE"):
        decoded()
    assert RAN == []


@pytest.mark.parametrize("value", ["false", "no", "off", "yes", "true"])
def test_a_switch_value_that_is_not_1_or_0_unpickles_nothing(pickles, monkeypatch, value):
    """``WDSX_ALLOW_PICKLE=false`` must not read as yes: only ``1`` allows, and any other
    value but ``0`` or empty is an error naming the variable, before anything is unpickled."""
    monkeypatch.setenv("WDSX_ALLOW_PICKLE", value)
    with pytest.raises(Exception, match=f"WDSX_ALLOW_PICKLE={value!r}"):
        list(wdsx.WebDataset(pickles, manifest=False).decode())
    assert RAN == []
    monkeypatch.setenv("WDSX_ALLOW_PICKLE", "0")
    with pytest.raises(Exception, match="WDSX_ALLOW_PICKLE"):
        list(wdsx.WebDataset(pickles, manifest=False).decode())
    assert RAN == []


def test_pth_fields_load_weights_only_by_default(tmp_path, monkeypatch):
    weights = write_tar(str(tmp_path / "w.tar"), [("a.pth", pth({"w": torch.ones(3)}))])
    (sample,) = wdsx.WebDataset(weights, manifest=False).decode()
    assert torch.equal(sample["pth"]["w"], torch.ones(3))
    objects = write_tar(str(tmp_path / "o.tar"), [("a.pth", pth(Custom(7)))])
    with pytest.raises(wdsx.DecodingError, match="WDSX_ALLOW_PICKLE"):
        list(wdsx.WebDataset(objects, manifest=False).decode())
    monkeypatch.setenv("WDSX_ALLOW_PICKLE", "1")
    (sample,) = wdsx.WebDataset(objects, manifest=False).decode()
    assert isinstance(sample["pth"], Custom) and sample["pth"].value == 7
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(wdsx.DecodingError, match="WDS_SECURE"):
        list(wdsx.WebDataset(objects, manifest=False).decode())


def test_secure_mode_refuses_pipe_urls(tmp_path, monkeypatch):
    path = write_tar(str(tmp_path / "x.tar"), [("a.txt", b"1")])
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(wdsx.SourceError, match="WDS_SECURE"):
        list(wdsx.WebDataset(f"pipe:cat {path}", manifest=False))


def png() -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(np.zeros((4, 4), np.uint8)).save(out, format="PNG")
    return out.getvalue()


def test_convert_does_not_follow_links_out_of_the_folder(tmp_path):
    src, outside = tmp_path / "src", tmp_path / "outside"
    (src / "cat").mkdir(parents=True)
    (outside / "secrets").mkdir(parents=True)
    (src / "cat" / "a.png").write_bytes(png())
    (outside / "private.png").write_bytes(png())
    (outside / "secrets" / "key.png").write_bytes(png())
    os.symlink(outside / "private.png", src / "cat" / "b.png")
    os.symlink(src / "cat" / "a.png", src / "cat" / "inside.png")
    os.symlink(outside / "secrets", src / "dog")
    os.symlink(src / "cat", src / "cat" / "loop")

    report = convert(str(src), str(tmp_path / "out" / "x"))
    keys = sorted(s["__key__"] for s in wdsx.WebDataset(str(tmp_path / "out" / "x-*.tar"), manifest=False))
    assert keys == ["cat/a", "cat/inside"]
    assert sorted(path for path, _ in report.skipped) == ["cat/b.png", "dog"]
    assert all("outside the source folder" in reason for _, reason in report.skipped)

    followed = convert(str(src), str(tmp_path / "followed" / "x"), follow_symlinks=True)
    keys = sorted(
        s["__key__"] for s in wdsx.WebDataset(str(tmp_path / "followed" / "x-*.tar"), manifest=False)
    )
    assert keys == ["cat/a", "cat/b", "cat/inside", "dog/key"] and followed.skipped == []


@pytest.fixture
def logged_pipe(tmp_path):
    """A ``pipe:`` command that logs its arguments, then prints the file it is given."""
    log = tmp_path / "calls.log"
    script = tmp_path / "show.sh"
    script.write_text(f'echo "$@" >> {log}\nexec cat "$1"\n')
    shard = write_tar(str(tmp_path / "x.tar"), [("a.txt", b"1"), ("b.txt", b"2")])
    with open(tmp_path / "x.manifest.json", "w") as stream:
        stream.write('{"format": "wdsx-manifest", "version": 1, "shards": []}')
    return f"pipe:sh {script} {shard}", log


@pytest.mark.parametrize("command", ["info", "verify", "ls"])
def test_commands_run_no_command_the_user_did_not_write(logged_pipe, command, capsys):
    url, log = logged_pipe
    assert cli.main([command, url]) == 0
    calls = log.read_text().splitlines()
    assert calls and all(call.endswith("x.tar") for call in calls), calls
    if command == "verify":
        assert "no manifest looked up for pipe:" in capsys.readouterr().out


def test_no_manifest_is_derived_from_a_pipe_url(logged_pipe, tmp_path):
    url, log = logged_pipe
    assert [s["__key__"] for s in wdsx.WebDataset(url)] == ["a", "b"]
    assert cli.main(["index", url]) == 1
    with wdsx.ShardWriter(f"pipe:cat > {tmp_path}/w-%d.tar", maxcount=1, verbose=0) as sink:
        sink.write({"__key__": "k", "txt": "x"})
    assert sink.manifest_url is None
    assert all(call.endswith("x.tar") for call in log.read_text().splitlines())


SIGNED = (
    "https://alice:hunter2@store.example/bucket/x.tar"
    "?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE%2F20260101&X-Amz-Signature=deadbeef"
)


def test_redact_masks_userinfo_and_signatures():
    shown = redact(SIGNED)
    assert (
        "hunter2" not in shown
        and "alice" not in shown
        and "deadbeef" not in shown
        and "AKIAEXAMPLE" not in shown
    )
    assert shown.startswith("https://***@store.example/bucket/x.tar?X-Amz-Algorithm=AWS4-HMAC-SHA256")
    assert (
        redact("https://h/x.tar?sig=abc&sv=2020&token=t#frag")
        == "https://h/x.tar?sig=***&sv=2020&token=***#frag"
    )
    assert redact("/data/x.tar") == "/data/x.tar"


def test_errors_never_show_credentials():
    for error in (
        wdsx.ShardError(SIGNED, 512, "truncated member", "a.txt"),
        wdsx.SourceError(SIGNED, "HTTP 403 Forbidden"),
        wdsx.DecodingError(SIGNED, "key", "jpg", None, ValueError(f"while reading {SIGNED}")),
        wdsx.ShardError(f"pipe:curl -s '{SIGNED}'", 0, "empty file"),
    ):
        message = str(error)
        assert "hunter2" not in message and "deadbeef" not in message, message
        assert "store.example" in message
        assert "deadbeef" not in str(pickle.loads(pickle.dumps(error)))


def test_http_errors_and_logs_never_show_credentials(tmp_path, caplog):
    server = RangeHTTPServer(str(tmp_path)).start()
    try:
        good = tar_bytes([(f"k{i}.txt", b"x" * 600) for i in range(4)])
        server.add("x.tar", good[:2000])
        truncated = server.url("x.tar") + "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=deadbeef"
        missing = server.url("nope.tar") + "?X-Amz-Signature=deadbeef"
        with pytest.raises(wdsx.SourceError) as caught:
            list(wdsx.WebDataset(missing, manifest=False, options=wdsx.SourceOptions(retries=0)))
        assert "deadbeef" not in str(caught.value) and "nope.tar" in str(caught.value)
        with caplog.at_level(logging.INFO, logger="wdsx"):
            kept = list(wdsx.WebDataset(truncated, manifest=False, handler=wdsx.warn_and_continue))
        assert [sample["__key__"] for sample in kept] == ["k0"]
        messages = [record.getMessage() for record in caplog.records]
        assert any("x.tar" in message for message in messages)
        assert not any("deadbeef" in message or "AKIAEXAMPLE" in message for message in messages), messages
    finally:
        server.stop()


SECRETS = ("hunter2", "deadbeef", "AKIAEXAMPLE")


def shown_secrets(text: str) -> list[str]:
    return [secret for secret in SECRETS if secret in text]


def test_checkpoints_reprs_cache_names_and_the_command_show_no_credentials(tmp_path, capsys):
    """A shard URL that carries a password and a signature: the checkpoints of a pipeline
    and of a loader (its workers' states inside) hold it masked, and still resume exactly
    (the uninterrupted run is the oracle), re-dealt to other workers too; reprs, the cache's
    file names and the command's output do not show it either."""
    server = RangeHTTPServer(str(tmp_path)).start()
    try:
        for name in ("x.tar", "z.tar"):
            server.add(name, tar_bytes([(f"{name[0]}{i:02d}.txt", b"x" * 100) for i in range(12)]))
        query = "?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature=deadbeef"
        urls = [
            server.url(name).replace("http://", "http://alice:hunter2@") + query
            for name in ("x.tar", "z.tar")
        ]
        options = wdsx.SourceOptions(
            cache_dir=str(tmp_path / "cache"), s3={"aws_secret_access_key": "hunter2"}
        )

        def dataset() -> wdsx.WebDataset:
            return wdsx.WebDataset(urls, shardshuffle=False, manifest=False, options=options).shuffle(5)

        def keys(items) -> list[str]:
            return [sample["__key__"] for sample in items]

        whole = keys(dataset())
        first = dataset()
        batches = iter(first)
        seen = keys(next(batches) for _ in range(7))
        state = json.loads(json.dumps(first.state_dict()))
        assert not shown_secrets(json.dumps(state))
        resumed = dataset()
        resumed.load_state_dict(state)
        assert seen + keys(resumed) == whole

        def loader(workers: int) -> wdsx.WebLoader:
            return wdsx.WebLoader(
                dataset().to_tuple("__key__").batched(3),
                batch_size=None,
                num_workers=workers,
                worker_type="thread",
            )

        two = loader(2)
        batches = iter(two)
        taken = [key for _ in range(2) for key in next(batches)[0]]
        saved = json.loads(json.dumps(two.state_dict()))
        del batches
        assert not shown_secrets(json.dumps(saved))
        again = loader(3)
        again.load_state_dict(saved)
        assert sorted(taken + [key for (keys_,) in again for key in keys_]) == sorted(whole)

        shown = " ".join([repr(dataset()), repr(loader(0)), repr(options), *os.listdir(tmp_path / "cache")])
        assert not shown_secrets(shown), shown
        assert cli.main(["ls", urls[0]]) == 0
        assert cli.main(["cat", urls[0], "nothere"]) == 1
        captured = capsys.readouterr()
        assert "x00" in captured.out and not shown_secrets(captured.out + captured.err)
    finally:
        server.stop()


def test_shards_that_mask_alike_resume_and_nothing_in_a_state_tests_a_password(tmp_path):
    """Two shard URLs that differ only in their signature (the same object listed twice), and a
    pipe: command with a password in its second URL: the checkpoint resumes exactly (each
    URL that could not be told apart from another once masked is kept as it is), holds no
    password, and nothing in it depends on the password (a pipeline reading with another one
    has the same fingerprint), so it cannot be guessed offline against the state."""
    server = RangeHTTPServer(str(tmp_path)).start()
    try:
        server.add("x.tar", tar_bytes([(f"x{i:02d}.txt", b"x" * 100) for i in range(12)]))

        def dataset(password: str) -> wdsx.WebDataset:
            signed = server.url("x.tar") + "?sig="
            # (the command's second word is a URL with a password, which the shell ignores)
            piped = f"pipe:cat {tmp_path / 'x.tar'} && : http://alice:{password}@example.com/x.tar"
            urls = [signed + "AAA", signed + "BBB", piped]
            return wdsx.WebDataset(urls, shardshuffle=False, manifest=False).shuffle(5)

        whole = [sample["__key__"] for sample in dataset("hunter2")]
        first = dataset("hunter2")
        batches = iter(first)
        seen = [next(batches)["__key__"] for _ in range(20)]
        state = json.loads(json.dumps(first.state_dict()))
        assert "hunter2" not in json.dumps(state)
        resumed = dataset("hunter2")
        resumed.load_state_dict(state)
        assert seen + [sample["__key__"] for sample in resumed] == whole
        assert dataset("hunter2").fingerprint() == dataset("swordfish").fingerprint()
    finally:
        server.stop()


_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from wdsx.write.writer import TarWriter
    writer = TarWriter(sys.argv[1])
    writer.write({"__key__": "a", "bin": bytes(2 << 20)})
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_leftovers_of_killed_writers_are_removed_but_live_writers_are_not(tmp_path):
    target = tmp_path / "x.tar"
    process = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target)], check=False)
    assert process.returncode == -signal.SIGKILL
    (leftover,) = [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]
    foreign = tmp_path / ".x.tar.written-by-another-tool.partial"
    foreign.write_bytes(b"?")
    assert is_abandoned(str(leftover)) and not is_abandoned(str(foreign))

    live = wdsx.TarWriter(str(target))  # this process is alive and holds the lock
    live.write({"__key__": "b", "txt": "x"})
    (mine,) = [p for p in tmp_path.iterdir() if p.name.endswith(".partial") and p != foreign]
    assert not leftover.exists()
    assert remove_abandoned_partials(str(target)) == [] and mine.exists() and foreign.exists()
    live.close()
    with tarfile.open(target) as archive:
        assert archive.getnames() == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([foreign.name, "x.tar"])


SECURE_PROBES = {
    "torch.load": lambda lib, tmp: lib.autodecode.torch_loads(_saved_tensor()),
    "local file": lambda lib, tmp: lib.gopen(str(tmp / "x.tar")),
    "file: URL": lambda lib, tmp: lib.gopen("file:" + str(tmp / "x.tar")),
    "pipe: URL": lambda lib, tmp: lib.gopen("pipe:cat /dev/null"),
}


def _saved_tensor() -> bytes:
    out = io.BytesIO()
    torch.save(torch.zeros(2), out)
    return out.getvalue()


@pytest.mark.parametrize("probe", sorted(SECURE_PROBES))
def test_secure_mode_refuses_what_webdataset_refuses(probe, tmp_path, monkeypatch):
    """webdataset's ``utils.enforce_security`` (wdsx: ``WDS_SECURE=1``) refuses torch.load, local
    files through gopen, and pipe: URLs with a ValueError; so does wdsx, through the same names."""
    import webdataset

    (tmp_path / "x.tar").write_bytes(tar_bytes([("k.txt", b"x")]))
    monkeypatch.setattr(webdataset.utils, "enforce_security", True)
    monkeypatch.setenv("WDS_SECURE", "1")
    for library in (webdataset, wdsx):
        with pytest.raises(ValueError):
            SECURE_PROBES[probe](library, tmp_path)
    monkeypatch.setattr(webdataset.utils, "enforce_security", False)
    monkeypatch.setenv("WDS_SECURE", "0")
    if probe != "pipe: URL":  # and allows them otherwise
        for library in (webdataset, wdsx):
            result = SECURE_PROBES[probe](library, tmp_path)
            if hasattr(result, "close"):
                result.close()


def test_secure_mode_refuses_url_rewriting_as_webdataset(monkeypatch):
    import webdataset
    from webdataset.gopen import rewrite_url as their_rewrite

    from wdsx.gopen import rewrite_url

    monkeypatch.setenv("GOPEN_REWRITE", "a://=b://")
    monkeypatch.setattr(webdataset.utils, "enforce_security", True)
    monkeypatch.setenv("WDS_SECURE", "1")
    for rewrite in (their_rewrite, rewrite_url):
        with pytest.raises(ValueError):
            rewrite("a://x.tar")
