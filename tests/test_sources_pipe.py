"""pipe:CMD sources and sinks: webdataset's semantics, and no process or descriptor left behind."""

from __future__ import annotations

import gc
import logging
import os
import shlex
import signal
import threading

import pytest
import webdataset

import wdsx
from tests.fixtures.servers import random_bytes, read_all
from tests.fixtures.shards import write_tar
from wdsx.errors import SourceError
from wdsx.sources import SourceOptions, open_sink, open_source
from wdsx.sources.pipe import PipeSource

DATA = random_bytes(3_000_001, seed=31)


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "shard.tar"
    path.write_bytes(DATA)
    return shlex.quote(str(path))


@pytest.fixture(autouse=True, scope="module")
def watcher_running():
    """The first command a process starts also starts the watcher that kills its commands if
    the process dies (wdsx.sources.reaper), with a pipe kept open for the process's life: it
    is started here, before any test counts this process's descriptors."""
    with PipeSource("pipe:true", 0, SourceOptions()) as source:
        assert source.read(1) == b""


def open_fds() -> set[tuple[str, str]]:
    """This process's open descriptors, each with what it points at (``pipe:[inode]``...)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, or another thread's)
    return found


def opened_since(before: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The descriptors opened since ``before`` (a test's own, if read right after it opened
    them: another test's threads may open and close descriptors at any time meanwhile)."""
    mine = open_fds() - before
    assert mine, "the command's pipe is not among the new descriptors"
    return mine


def still_open(mine: set[tuple[str, str]]) -> set[tuple[str, str]]:
    return mine & open_fds()


def assert_gone(pid: int) -> None:
    """The command was reaped (no zombie) and nothing is left in its process group."""
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)
    assert not os.path.exists(f"/proc/{pid}")
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)


def test_reads_the_command_output(shard):
    with open_source(f"pipe:cat {shard}") as source:
        assert source.local_path is None and not source.seekable
        assert read_all(source) == DATA


def test_offset_reads_and_discards_and_says_so_once(shard, caplog):
    caplog.set_level(logging.INFO, logger="wdsx")
    with open_source(f"pipe:cat {shard}", 1_500_000, SourceOptions(chunk=1 << 16)) as source:
        assert read_all(source) == DATA[1_500_000:]
    said = [r for r in caplog.records if r.name == "wdsx" and "cannot seek" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO


def test_offset_beyond_the_stream_is_an_error(shard):
    with pytest.raises(SourceError, match="stream ended at byte 3000001, before offset 4000000"):
        open_source(f"pipe:cat {shard}", 4_000_000)


@pytest.mark.parametrize("pipeline", ["cat {shard}", "cat {shard} | cat | cat"])
def test_early_close_leaves_no_process_and_no_descriptor(shard, pipeline):
    before = open_fds()
    source = PipeSource(f"pipe:{pipeline.format(shard=shard)}", 0, SourceOptions())
    mine = opened_since(before)
    assert source.read(1000) == DATA[:1000]
    pid = source._process.pid
    source.close()
    source.close()
    assert_gone(pid)
    assert not still_open(mine)


@pytest.mark.slow
def test_garbage_collection_reaps_the_command(shard):
    gc.collect()  # what earlier tests left for the collector must not close descriptors below
    before = open_fds()
    source = PipeSource(f"pipe:cat {shard} | cat", 0, SourceOptions())
    mine = opened_since(before)
    assert source.read(10) == DATA[:10]
    pid = source._process.pid
    del source
    gc.collect()
    assert_gone(pid)
    assert not still_open(mine)


def test_abandoned_generator_reaps_the_command(shard):
    def samples():
        with open_source(f"pipe:cat {shard}") as source:
            while data := source.read(1000):
                yield data

    before = open_fds()
    stream = samples()
    next(stream)
    mine = opened_since(before)
    pid = stream.gi_frame.f_locals["source"]._process.pid
    stream.close()
    assert_gone(pid)
    assert not still_open(mine)


@pytest.mark.parametrize(
    "command, status", [("cat /nonexistent/shard.tar", 1), ("head -c 10 {shard}; exit 3", 3)]
)
def test_failing_command_raises_with_its_status(shard, command, status):
    url = f"pipe:{command.format(shard=shard)}"
    with open_source(url) as source:
        with pytest.raises(SourceError, match=f"exited with status {status}") as caught:
            read_all(source)
    assert caught.value.url == url


def test_sigpipe_status_is_not_an_error(shard):
    with open_source(f"pipe:cat {shard}; exit 141") as source:
        assert read_all(source) == DATA


def test_secure_mode_refuses_pipes(shard, monkeypatch):
    with pytest.raises(SourceError, match="pipe: URLs are disabled"):
        open_source(f"pipe:cat {shard}", 0, SourceOptions(allow_pipe=False))
    monkeypatch.setenv("WDS_SECURE", "1")
    with pytest.raises(SourceError, match="pipe: URLs are disabled"):
        open_source(f"pipe:cat {shard}")
    with pytest.raises(SourceError, match="pipe: URLs are disabled"):
        open_sink(f"pipe:cat > {shard}")


def test_sink_writes_to_the_command_and_commit_checks_its_status(tmp_path):
    target = tmp_path / "out.tar"
    with open_sink(f"pipe:cat > {shlex.quote(str(target))}") as sink:
        sink.write(DATA[:1000])
        sink.write(DATA[1000:])
    assert target.read_bytes() == DATA
    sink = open_sink(f"pipe:cat > {shlex.quote(str(tmp_path / 'missing' / 'out.tar'))}")
    sink.write(b"x")
    with pytest.raises(SourceError, match="exited with status"):
        sink.commit()


def test_aborted_sink_reaps_the_command(tmp_path):
    before = open_fds()
    sink = open_sink(f"pipe:cat > {shlex.quote(str(tmp_path / 'out.tar'))}")
    mine = opened_since(before)
    sink.write(b"partial")
    pid = sink._process.pid
    sink.abort()
    assert_gone(pid)
    assert not still_open(mine)


@pytest.mark.parametrize(
    "command, status",
    [("exec sleep 30", -signal.SIGTERM), ("sleep 30; cat {shard}", 128 + signal.SIGPIPE)],
    ids=["command-alone", "shell-with-children"],
)
@pytest.mark.slow
def test_command_that_is_not_writing_is_signalled_and_reaped(shard, command, status):
    before = open_fds()
    source = PipeSource(f"pipe:{command.format(shard=shard)}", 0, SourceOptions())
    mine = opened_since(before)
    pid = source._process.pid
    source.close()
    assert_gone(pid)
    assert source._process.returncode == status
    assert not still_open(mine)


def test_leaving_early_stops_a_command_opened_ahead_that_sends_nothing(tmp_path, monkeypatch):
    """A reader that stops while the next shard's command, opened ahead, has sent nothing
    yet (a slow server) stops that command at once: leaving the loop does not wait for it."""
    marker = f"WDSX_PIPE_TEST_{os.getpid()}"
    monkeypatch.setenv(marker, "1")  # inherited by the commands
    shard = write_tar(str(tmp_path / "shard.tar"), [(f"k{i}.txt", b"x") for i in range(5)])
    urls = [f"pipe:cat {shard}", f"pipe:sleep 60; cat {shard}"]
    options = SourceOptions(timeout=5)  # the longest a stop waits for the thread opening it
    dataset = wdsx.WebDataset(urls, shardshuffle=False, manifest=False, options=options)
    for number, _ in enumerate(dataset.map(lambda sample: sample)):
        if number == 1:
            break
    del dataset
    gc.collect()  # the stream ends with the dataset (a reference cycle keeps it until then)

    def commands() -> list[str]:
        found = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                with open(f"/proc/{entry}/environ", "rb") as environ:
                    if f"{marker}=1".encode() in environ.read().split(b"\0") and entry != str(os.getpid()):
                        found.append(entry)
            except OSError:
                continue
        return found

    assert not commands()


def test_a_fifo_shard_is_read_as_its_writer_sends_it(tmp_path):
    """A named pipe given as a local shard: read as a stream, the bytes its writer sends."""
    shard = tmp_path / "written.tar"
    with webdataset.TarWriter(str(shard)) as writer:
        for i in range(3):
            writer.write({"__key__": f"s{i}", "txt": f"text {i}"})
    fifo = tmp_path / "fifo.tar"
    os.mkfifo(fifo)

    def send() -> None:
        with open(fifo, "wb") as stream:  # blocks until the reader opens it
            stream.write(shard.read_bytes())

    sender = threading.Thread(target=send)
    sender.start()
    samples = [(s["__key__"], s["txt"]) for s in wdsx.WebDataset(str(fifo), shardshuffle=False)]
    sender.join()
    expected = [(s["__key__"], s["txt"]) for s in webdataset.WebDataset(str(shard), shardshuffle=False)]
    assert samples == expected


def test_a_fifo_shard_whose_writer_never_comes_stalls_instead_of_hanging(tmp_path):
    fifo = tmp_path / "fifo.tar"
    os.mkfifo(fifo)
    with pytest.raises(SourceError, match=r"fifo\.tar: reading at byte 0: stalled"):
        with open_source(str(fifo), options=SourceOptions(stall_timeout=0.3)) as source:
            source.read(512)
