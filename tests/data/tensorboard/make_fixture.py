#!/usr/bin/env python3
"""Accepts an event file written by ferry's TensorBoardWriter as the test fixture, only if
the real `tensorboard` package reads back exactly the scalars below.

test_tensorboard (bytes_equal_the_fixture_tensorboard_read) writes these scalars and
compares its bytes with scalars.tfevents, so CI needs no Python; this script is what
proves that the fixture is a file TensorBoard reads. To make it again:

  python3 -m venv /tmp/tbvenv && /tmp/tbvenv/bin/pip install tensorboard
  FERRY_TENSORBOARD_FIXTURE_OUT=/tmp/f.tfevents build/tests/test_tensorboard
  /tmp/tbvenv/bin/python tests/data/tensorboard/make_fixture.py /tmp/f.tfevents

Checked, each through TensorBoard's own code: the framing and CRCs (its record reader,
which stops quietly at a bad record, so every record is also counted); each record equal
to protobuf's serialization of the expected Event (so the bytes are canonical, not merely
parseable); the scalars as the Python loader (EventAccumulator) and the Rust data server
(what `tensorboard --logdir` uses by default) present them. Copies the file to
scalars.tfevents beside this script only when all of that passed.
"""
import os
import shutil
import struct
import sys
import tempfile
import time

from tensorboard.backend.event_processing import event_accumulator, event_file_loader
from tensorboard.compat.proto import event_pb2
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
from tensorboard.data import server_ingester
from tensorboard.util import grpc_util

START = 1700000000.0
# Per step, the loss then the learning rate; wall time START + step.
EXPECTED = [
    ("train/loss", 1, 5.5), ("train/lr", 1, 0.001),
    ("train/loss", 2, 4.25), ("train/lr", 2, 0.0009),
    ("train/loss", 3, 3.125), ("train/lr", 3, 0.0008),
]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def check(cond, what):
    if not cond:
        sys.exit("REFUSED: " + what)


def expected_events():
    events = [event_pb2.Event(wall_time=START, file_version="brain.Event:2")]
    for tag, step, value in EXPECTED:
        e = event_pb2.Event(wall_time=START + step, step=step)
        e.summary.value.add(tag=tag, simple_value=value)
        events.append(e)
    return events


def records_by_hand(data):
    """Splits the file into records, checking lengths and CRCs with TensorBoard's crc."""
    out, off = [], 0
    while off < len(data):
        check(len(data) - off >= 16, "truncated record at byte %d" % off)
        (n,) = struct.unpack_from("<Q", data, off)
        check(struct.unpack_from("<I", data, off + 8)[0] == masked_crc32c(data[off:off + 8]),
              "length CRC at byte %d" % off)
        check(n <= len(data) - off - 16, "length past the end at byte %d" % off)
        body = data[off + 12:off + 12 + n]
        check(struct.unpack_from("<I", data, off + 12 + n)[0] == masked_crc32c(body),
              "data CRC at byte %d" % off)
        out.append(body)
        off += 16 + n
    return out


def check_records(path):
    data = open(path, "rb").read()
    raw = list(event_file_loader.RawEventFileLoader(path).Load())
    check(raw == records_by_hand(data), "TensorBoard's record reader did not read every record")
    want = [e.SerializeToString() for e in expected_events()]
    check(len(raw) == len(want), "%d records, expected %d" % (len(raw), len(want)))
    for i, (got, exp) in enumerate(zip(raw, want)):
        check(got == exp, "record %d: %r, protobuf serializes %r" % (i, got, exp))
    first = next(iter(event_file_loader.LegacyEventFileLoader(path).Load()))
    check(first.file_version == "brain.Event:2" and first.wall_time == START, "file_version event")


def check_accumulator(path):
    acc = event_accumulator.EventAccumulator(path)
    acc.Reload()
    check(acc.file_version == 2.0, "file version %r" % acc.file_version)
    got = {tag: [(s.wall_time, s.step, s.value) for s in acc.Scalars(tag)]
           for tag in acc.Tags()["scalars"]}
    want = {}
    for tag, step, value in EXPECTED:
        want.setdefault(tag, []).append((START + step, step, f32(value)))
    check(got == want, "EventAccumulator scalars %r, expected %r" % (got, want))


def check_data_server(path):
    with tempfile.TemporaryDirectory() as logdir:
        os.mkdir(os.path.join(logdir, "run"))
        shutil.copy(path, os.path.join(logdir, "run", "events.out.tfevents.1700000000.fixture"))
        ingester = server_ingester.SubprocessServerDataIngester(
            server_ingester.get_server_binary(), logdir, reload_interval=0,
            channel_creds_type=grpc_util.ChannelCredsType.LOCAL)
        ingester.start()
        provider = ingester.data_provider
        got = {}
        for _ in range(100):  # the server loads in the background
            res = provider.read_scalars(None, experiment_id="", plugin_name="scalars",
                                        downsample=1000).get("run", {})
            got = {tag: [(d.wall_time, d.step, d.value) for d in data] for tag, data in res.items()}
            if sum(len(v) for v in got.values()) == len(EXPECTED):
                break
            time.sleep(0.1)
        want = {}
        for tag, step, value in EXPECTED:
            want.setdefault(tag, []).append((START + step, step, f32(value)))
        check(got == want, "data server scalars %r, expected %r" % (got, want))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_fixture.py EVENT_FILE_WRITTEN_BY_FERRY")
    path = sys.argv[1]
    check_records(path)
    check_accumulator(path)
    check_data_server(path)
    dest = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scalars.tfevents")
    shutil.copyfile(path, dest)
    print("ACCEPTED: %s -> %s (%d records, %d scalars)" % (path, dest, len(EXPECTED) + 1, len(EXPECTED)))


if __name__ == "__main__":
    main()
