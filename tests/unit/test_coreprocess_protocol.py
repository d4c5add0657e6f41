"""The engine core's messages and its per-frontend outbox, without processes: every message kind
round-trips through msgspec; DecodingParams survive the wire; a stream's tokens merge while the
frontend has not taken the previous message, but a job's first tokens and its end go out at once;
events of a job keep their order; a Forget-style drop leaves no job behind; the frames of the
frontend <-> core connection survive any split, and a peer whose frontend stops reading never blocks
the sender and loses nothing."""
from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from server.core import relay
from server.coreprocess import protocol
from server.coreprocess.channel import Frames, Peer, frame
from server.frontend.cores.link import error_of
from server.coreprocess.process import Outbox, to_wire
from server.core.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, ServiceError, Unavailable
from server.core.request import DecodingParams, ErrorEvent, FinishEvent, FinishReason, Hypothesis, Timing, TokenEvent


def test_every_message_round_trips():
    params = protocol.params_out(DecodingParams(beam_size=4, temperature=0.0, seed=7, target_prefix="Ein",
                                            repetition_penalty=1.2, no_repeat_ngram_size=3, alternatives=0))
    spec = protocol.JobSpec(5, "translate", "m", [1, 2, 3], 12.5, 99.0, params, 40, True, False, (7,), (8, 9))
    messages = [protocol.Hello(b"frontend-7"), protocol.Submit(1, "m", [spec]), protocol.Cancel([5]), protocol.Hold(), protocol.Resume(),
                protocol.AskMetrics(2),
                protocol.Forget(b"frontend-1"), protocol.Stop(3.0)]
    for msg in messages:
        assert protocol.to_core(protocol.encode(msg)) == msg
    events = protocol.Events([protocol.Tokens(5, [4, 5]), protocol.Finished(5, [([4, 5, 2], -1.5, True)], "eos", 3,
                                                                  (1.0, 2.0, 3.0, 2.5)),
                          protocol.Failed(6, "DEADLINE_EXCEEDED", "late"), protocol.Embedded(7, b"\0\0\0\0")])
    for msg in [protocol.Ready([protocol.ModelFacts("m", "CPUExecutionProvider", 64, "int8-vnni")], 123), protocol.Accepted(1),
                protocol.Refused(1, "RESOURCE_EXHAUSTED", "full"), events, protocol.MetricsText(2, "# text")]:
        assert protocol.to_frontend(protocol.encode(msg)) == msg


def test_decoding_params_survive_the_wire():
    p = DecodingParams(beam_size=3, length_penalty=0.6, temperature=0.7, top_k=5, top_p=0.9, seed=None,
                       max_output_tokens=20, num_hypotheses=2, repetition_penalty=1.3, no_repeat_ngram_size=2,
                       min_output_tokens=4, no_unknown_token=True, target_prefix="Der", alternatives=0)
    assert protocol.params_in(protocol.to_core(protocol.encode(protocol.Submit(1, "m", [protocol.JobSpec(
        1, "translate", "m", [1], 0.0, None, protocol.params_out(p))]))).jobs[0].params) == p


@pytest.mark.parametrize("kind", [InvalidArgument, ResourceExhausted, Unavailable, DeadlineExceeded])
def test_error_kinds_come_back_as_themselves(kind):
    error = error_of(kind.code, "why")
    assert type(error) is kind and str(error) == "why"
    assert type(error_of("NO_SUCH_CODE", "x")) is ServiceError


def test_engine_events_become_wire_items():
    timing = Timing(arrival=1.0, scheduled=1.5, first_token=2.0, finished=3.0, last_token=2.9)
    finished = to_wire(4, FinishEvent([Hypothesis([np.int64(5), 2], -0.5, True)], FinishReason.LENGTH, 7, timing))
    assert finished == protocol.Finished(4, [([5, 2], -0.5, True)], "length", 7, (1.5, 2.0, 3.0, 2.9))
    assert to_wire(4, TokenEvent([3])) == protocol.Tokens(4, [3])
    assert to_wire(4, ErrorEvent(DeadlineExceeded("late"))) == protocol.Failed(4, "DEADLINE_EXCEEDED", "late")
    assert to_wire(4, RuntimeError("bug")) == protocol.Failed(4, "INTERNAL", "bug")
    vector = to_wire(4, np.array([1.0, 2.0], dtype=np.float64))
    assert np.frombuffer(vector.vector, dtype=np.float32).tolist() == [1.0, 2.0]


@pytest.fixture
def pair():
    """A connected Unix stream socket pair: the core's Peer on one end, the frontend's plain socket on the other."""
    core_end, frontend_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    woken = []
    peer = Peer(core_end, lambda: woken.append(1))
    peer.woken = woken
    yield peer, frontend_end
    peer.close()
    frontend_end.close()


@pytest.fixture
def outbox(pair):
    woken = []
    box = Outbox(pair[0], lambda: woken.append(1))
    box.woken = woken  # the core's main thread, woken (Core._wake)
    return box


def test_tokens_merge_while_held_and_first_tokens_and_ends_are_urgent(outbox):
    outbox.post(protocol.Tokens(1, [10]))
    assert outbox.urgent  # a first token: sent even while the frontend is behind
    assert outbox.take() == [protocol.Tokens(1, [10])] and not outbox.urgent
    for t in (11, 12, 13):  # the frontend is behind: the same stream's tokens merge into one item
        outbox.post(protocol.Tokens(1, [t]))
    outbox.post(protocol.Tokens(2, [20]))  # another job's first token: urgent again, its own item
    assert outbox.urgent
    outbox.post(protocol.Failed(1, "CANCELLED", "gone"))  # an end comes after the job's tokens
    outbox.post(protocol.Tokens(2, [21]))
    assert outbox.take() == [protocol.Tokens(1, [11, 12, 13]), protocol.Tokens(2, [20, 21]), protocol.Failed(1, "CANCELLED", "gone")]
    outbox.post(protocol.Tokens(2, [22]))  # not a first token any more, nothing ended: not urgent
    assert not outbox.urgent


def test_an_engine_thread_wakes_the_socket_thread_once_per_step(outbox):
    woken = []
    outbox._wake = lambda: woken.append(1)
    relay.hold_wakeups()  # as the engine loop does
    try:
        for t in range(5):
            outbox.post(protocol.Tokens(1, [t]))
        assert woken == []
        relay.flush()
        assert woken == [1]
    finally:
        relay._thread.held = None


def test_the_engine_thread_sends_each_steps_events_on_the_frontends_connection(outbox, pair):
    """The step's end sends the step's events from the engine thread, one message; held, only a first
    token or an end goes; gone (the frontend died), nothing goes."""
    _, frontend_end = pair
    frontend_end.settimeout(0.2)
    frames = Frames()

    def received() -> list:
        messages = []
        try:
            while True:
                messages += [protocol.to_frontend(p) for p in frames.feed(frontend_end.recv(65536))]
        except socket.timeout:
            return messages

    def step(*items) -> None:  # what the engine loop does: post during the step, flush at its end
        relay.hold_wakeups()
        try:
            for item in items:
                outbox.post(item)
            relay.flush()
        finally:
            relay._thread.held = None
    step(protocol.Tokens(1, [10]), protocol.Tokens(2, [20]))
    assert received() == [protocol.Events([protocol.Tokens(1, [10]), protocol.Tokens(2, [20])])]
    outbox.held = True  # the frontend said Hold
    step(protocol.Tokens(1, [11]))
    step(protocol.Tokens(1, [12]))
    assert received() == []  # collected, merged
    step(protocol.Finished(2, [([20], 0.0, True)], "eos", 1, (None, None, None, None)))  # an end: urgent
    assert received() == [protocol.Events([protocol.Tokens(1, [11, 12]),
                                       protocol.Finished(2, [([20], 0.0, True)], "eos", 1, (None, None, None, None))])]
    outbox.gone = True  # the frontend died: dropped
    step(protocol.Tokens(1, [13]))
    assert received() == [] and not outbox.items


def test_a_post_off_the_engine_thread_is_left_to_the_main_thread(outbox):
    """A job failed while its engine sleeps (posted from another thread) is due for the main thread,
    which is woken (Core._wake); nothing is sent from the posting thread."""
    outbox.post(protocol.Failed(1, "CANCELLED", "gone"))
    assert outbox.main_due and outbox.woken == [1]
    assert outbox.items == [protocol.Failed(1, "CANCELLED", "gone")]


@pytest.mark.parametrize("cut", [1, 3, 4, 5, 9])
def test_frames_survive_any_split(cut):
    messages = [protocol.Accepted(1), protocol.Events([protocol.Tokens(3, list(range(40)))]), protocol.Refused(2, "X", "why")]
    data = b"".join(frame(protocol.encode(m)) for m in messages)
    frames, got = Frames(), []
    for at in range(0, len(data), cut):
        got += [protocol.to_frontend(p) for p in frames.feed(data[at:at + cut])]
    assert got == messages


def test_a_corrupt_length_is_refused():
    with pytest.raises(ValueError):
        Frames().feed(b"\xff\xff\xff\xff" + b"x")


def test_a_peer_that_stops_reading_never_blocks_the_sender_and_loses_nothing(pair):
    """The frontend does not read: the kernel's buffer fills, sends return at once and keep the rest in
    order (the main thread is woken to watch for room); once the frontend reads, every frame arrives."""
    peer, frontend_end = pair
    payload = b"y" * 65536
    count = 400  # 26 MB: more than any socket buffer takes
    sender = threading.Thread(target=lambda: [peer.send(payload + i.to_bytes(4, "little")) for i in range(count)])
    sender.start()
    sender.join(10)
    assert not sender.is_alive() and peer.pending and peer.woken
    frames, got = Frames(), []
    frontend_end.setblocking(False)
    while len(got) < count:
        peer.write_pending()  # what the core's main thread does when the selector says there is room
        try:
            got += frames.feed(frontend_end.recv(1 << 20))
        except BlockingIOError:
            pass
    assert [int.from_bytes(g[-4:], "little") for g in got] == list(range(count))
    assert peer.write_pending()


def test_a_send_to_a_frontend_that_is_gone_is_dropped(pair):
    peer, frontend_end = pair
    frontend_end.close()
    peer.send(b"x" * 10)
    peer.send(b"x" * 10)  # EPIPE by now: no exception, the peer is marked broken
    assert peer.broken and peer.receive() is None


def test_terminal_items_release_the_job(outbox):
    outbox.jobs[3] = object()
    outbox.post(protocol.Finished(3, [([2], 0.0, True)], "eos", 1, (None, None, None, None)))
    assert 3 not in outbox.jobs


@pytest.mark.parametrize("value,core,spins", [("auto", "thread", True), ("auto", "process", False),
                                              ("true", "process", True), ("false", "thread", False),
                                              (" AUTO ", "process", False), (True, "process", True)])
def test_ort_spinning_auto_spins_only_beside_the_frontend(value, core, spins):
    """With the engine in its own process, spinning ONNX Runtime workers take the cores the frontend
    process needs (docs/serving_speed.md): auto spins only with the engine thread."""
    from server.config import ServerConfig
    cfg = ServerConfig(ort_spinning=value, engine_core=core)
    assert cfg.spinning is spins and not cfg.problems()


def test_a_bad_ort_spinning_value_is_a_named_problem():
    from server.config import ServerConfig
    assert any("--ort-spinning" in p for p in ServerConfig(ort_spinning="sometimes").problems())


@pytest.mark.parametrize("core,frontends,threads,replicas,physical,cpus,expected", [
    ("process", 0, 0, 0, 2, 2, (2, 1)),    # 2 cores: one frontend, two single-thread replicas
    ("process", 0, 0, 1, 2, 2, (1, 1)),    # one replica: a core left to the frontend
    ("process", 0, 0, 1, 8, 16, (1, 4)),   # 16 CPUs, 8 cores: four frontends, one replica of four threads
    ("process", 0, 0, 0, 8, 16, (5, 1)),   # ... by default five single-thread replicas (three extra frontends)
    ("process", 3, 0, 0, 2, 2, (1, 1)),    # never below one
    ("process", 0, 6, 0, 2, 2, (2, 6)),    # an explicit count is kept
    ("thread", 0, 0, 0, 8, 16, (1, 0)),    # beside the frontend: ONNX Runtime's default
])
def test_the_engine_core_leaves_a_core_to_each_frontend(monkeypatch, core, frontends, threads, replicas, physical,
                                                        cpus, expected):
    """--engine-replicas 0 with the engine in core processes: one single-thread replica per physical core,
    less one per extra frontend; --intra-op-threads 0: the physical cores less one per frontend
    process, shared by the replicas (a loaded frontend keeps a core busy; engine threads sharing it
    wait at every barrier)."""
    import server.config as config
    monkeypatch.setattr(config, "physical_cores", lambda: physical)
    monkeypatch.setattr(config.os, "cpu_count", lambda: cpus)
    cfg = config.ServerConfig(engine_core=core, frontends=frontends, intra_op_threads=threads,
                              engine_replicas=replicas)
    assert (cfg.replicas, cfg.engine_threads) == expected and not cfg.problems()


def test_physical_cores_counts_each_core_once():
    from server.config import physical_cores
    import os
    assert 1 <= physical_cores() <= len(os.sched_getaffinity(0))


@pytest.mark.parametrize("text,cpus", [("200000 100000\n", 2), ("150000 100000\n", 2), ("50000 100000\n", 1),
                                       ("max 100000\n", 0), ("garbage\n", 0), (None, 0)])
def test_a_containers_cpu_quota_bounds_the_default_replicas(tmp_path, monkeypatch, text, cpus):
    """A CPU limit (cgroup v2 cpu.max) leaves the affinity at every core of the node: the default replica
    count must follow the limit, rounded up, or a 2-CPU pod on a 64-core node would start 64 engines."""
    import server.config as config
    path = tmp_path / "cpu.max"
    if text is not None:
        path.write_text(text)
    assert config.cpu_quota(str(path)) == cpus
    monkeypatch.setattr(config, "cpu_quota", lambda: 0)
    unlimited = config.physical_cores()
    monkeypatch.setattr(config, "cpu_quota", lambda: cpus)
    assert config.physical_cores() == (min(cpus, unlimited) if cpus else unlimited)
    if cpus:  # and the default replica count follows it (one per core, the frontend sharing them)
        assert config.ServerConfig(engine_core="process", frontends=1).replicas == min(cpus, unlimited)


@pytest.mark.parametrize("device,core,expected", [
    ("cuda:0,cuda:1", "process", [0, 1]),   # a replica per listed device
    ("cuda:3", "process", [3]),
    ("cuda:1", "thread", [1]),              # the in-process engine on the device named
    ("", "thread", [0]),
])
def test_on_cuda_each_engine_replica_drives_one_device(device, core, expected):
    """--device cuda:N[,cuda:M]: one engine replica per GPU, each replica's own config naming its device
    (the core process reads it into RuntimeOptions.device_id)."""
    from server.config import ServerConfig
    from server.frontend.cores.replicas import Replicas
    from server.observability.metrics import Metrics
    cfg = ServerConfig(provider="cuda", device=device, engine_core=core)
    assert cfg.devices == expected and not cfg.problems()
    if core == "process":
        assert cfg.replicas == len(expected)

        async def nothing() -> None:
            return None
        members = Replicas(cfg, Metrics(), nothing, nothing).members
        assert [m.cfg.device for m in members] == [f"cuda:{d}" for d in expected]


def test_more_replicas_than_devices_take_the_devices_in_turn():
    """--engine-replicas 3 over --device cuda:0,cuda:1: three replicas, the devices in turn."""
    from server.config import ServerConfig
    from server.frontend.cores.replicas import Replicas
    from server.observability.metrics import Metrics

    async def nothing() -> None:
        return None
    cfg = ServerConfig(provider="cuda", device="cuda:0,cuda:1", engine_core="process", engine_replicas=3)
    members = Replicas(cfg, Metrics(), nothing, nothing).members
    assert [m.cfg.device for m in members] == ["cuda:0", "cuda:1", "cuda:0"]


@pytest.mark.parametrize("device", ["gpu0", "cuda:", "cuda:a", "cuda:0;cuda:1"])
def test_a_malformed_device_list_is_refused(device):
    from server.config import ServerConfig
    assert any("--device must be" in p for p in ServerConfig(provider="cuda", device=device).problems())
    assert any("needs --engine-core process" in p
               for p in ServerConfig(provider="cuda", device="cuda:0,cuda:1", engine_core="thread").problems())


def test_the_cuda_provider_is_given_its_device():
    """RuntimeOptions.device_id reaches ONNX Runtime as the CUDA provider's device_id option (the device
    itself: tests/integration/test_gpu.py)."""
    from models.core.runtime import with_device
    assert with_device(["CUDAExecutionProvider", "CPUExecutionProvider"], 2) == [
        ("CUDAExecutionProvider", {"device_id": "2"}), "CPUExecutionProvider"]
    assert with_device(["CPUExecutionProvider"], 2) == ["CPUExecutionProvider"]


def test_int8_weights_setting_is_checked():
    from server.config import ServerConfig
    assert not ServerConfig(variant="int8", int8_weights="7").problems()
    assert any("--int8-weights must be auto, 7 or 8" in p for p in ServerConfig(int8_weights="eight").problems())
    assert any("--int8-activations must be auto, static or row" in p
               for p in ServerConfig(int8_activations="dynamic").problems())
    assert any("--calibration-text /nonexistent/c.txt: no such file" in p
               for p in ServerConfig(calibration_text="/nonexistent/c.txt").problems())
    assert not ServerConfig(variant="int8", int8_activations="row", calibration_text=__file__).problems()


def test_a_links_tallies_follow_its_jobs():
    """The replicas choose by each link's outstanding source tokens and background jobs for every call
    (replicas.py pick): the tallies follow the jobs in, out, twice out, and all out when the core is lost."""
    from server.frontend.cores.link import CoreLink
    from server.core.request import Job
    failed = []
    link = CoreLink("/nonexistent/core.sock")
    a = Job("m", [1, 2, 3], DecodingParams(), 8, failed.append, None)
    b = Job("m", [4], DecodingParams(), 8, failed.append, None, background=True)
    c = Job("m", [5, 6], DecodingParams(), 8, failed.append, None)
    for job in (a, b, c):
        link._track(job)
    assert (link.source_tokens, link.background_jobs) == (6, 1)
    assert link._release(b.id) is b and (link.source_tokens, link.background_jobs) == (5, 0)
    assert link._release(b.id) is None and link.source_tokens == 5  # released once, counted once
    assert link.lost(Unavailable("gone")) == 2 and len(failed) == 2
    assert (link.source_tokens, link.background_jobs, link.jobs) == (0, 0, {})


def test_a_link_whose_connection_ends_takes_no_more_work():
    """The core's end of the connection closed (it is exiting): the link is down at once, so the replicas
    choose another one, and a send says UNAVAILABLE (retryable) instead of writing into a closed socket."""
    from server.frontend.cores.link import CoreLink
    link = CoreLink("/nonexistent/core.sock")
    link.up, link.channel = True, object()
    link._on_lost(None)
    assert not link.up and link.channel is None
    with pytest.raises(Unavailable):
        link._send(protocol.Cancel([1]))
