"""Cores fed by inbox on the virtual driver (`workloads.core`, `rack.runtime.virtual`):
the same messages in the same order and at the same instant as through the queue."""

from workloads.core import Core

from rack.runtime.virtual import VirtualDriver


class Sender(Core):
    """Sends `note(i)` to the sink at each of `times`, and `bell()` to the sink at the last."""

    def __init__(self, name, times):
        super().__init__(name)
        self.times = list(times)
        self.wake_at = self.times[0]

    def on_wake(self, now):
        self.send("sink", "note", self.name, now)
        self.times.pop(0)
        if not self.times:
            self.send("sink", "bell")
        self.wake_at = self.times[0] if self.times else float("inf")


class Sink(Core):
    def __init__(self):
        super().__init__("sink")
        self.log = []

    def note(self, now, who, t):
        self.log.append(("note", who, t, now))

    def bell(self, now):
        self.log.append(("bell", now))


def _run(feeds):
    cores = {"a": Sender("a", [1.0, 2.0, 2.0, 3.0]), "b": Sender("b", [2.0, 2.5]), "sink": Sink()}
    drv = VirtualDriver(cores)
    if feeds is not None:
        drv.feed_inboxes(feeds)
    drv.run(lambda: False)
    return cores["sink"].log, drv


def test_inbox_gives_the_queue_order_and_instants():
    queued, dq = _run(None)
    for feeds in ({"sink": None}, {"sink": ("note",)}):     # every message, or only `note`, by inbox
        fed, df = _run(feeds)
        assert fed == queued
        assert all(entry[-1] == entry[-2] for entry in fed if entry[0] == "note")   # at the instant sent
        assert df.messages < dq.messages and df.wakeups == dq.wakeups
    assert _run({"sink": ("note",)})[1].messages == dq.messages - 6    # the bells still queued


class Records(Sink):
    """A sink whose `note` records carry their own time (deferrable) and that reads
    nothing else: `now` is None when the driver deferred them."""

    def note(self, now, who, t):
        self.log.append(("note", who, t, "deferred" if now is None else now))


def test_deferred_inbox_keeps_the_order_and_is_taken_before_a_call():
    cores = {"a": Sender("a", [1.0, 2.0, 2.0, 3.0]), "b": Sender("b", [2.0, 2.5]), "sink": Records()}
    drv = VirtualDriver(cores)
    drv.feed_inboxes({"sink": ("note",)}, deferred=("sink",))
    drv.run(lambda: False)
    log = cores["sink"].log
    queued, _ = _run(None)
    # the same records in the same order; the bell (a queued message) still comes after
    # every note sent before it, which the sink took from its inbox first
    assert [e[:3] for e in log] == [e[:3] for e in queued]
    assert all(e[-1] == "deferred" for e in log if e[0] == "note")
    assert not cores["sink"].inbox


def test_deferred_inbox_is_taken_when_full(monkeypatch):
    import rack.runtime.virtual as V

    monkeypatch.setattr(V, "DEFER_ITEMS", 2)
    cores = {"a": Sender("a", [1.0, 2.0, 3.0, 4.0, 5.0]), "sink": Records()}
    taken = []                              # notes handled at each done check
    drv = VirtualDriver(cores)
    drv.feed_inboxes({"sink": ("note",)}, deferred=("sink",))
    drv.run(lambda: taken.append(len(cores["sink"].log)) and False)
    # two notes wait, then are taken together; the bell (queued) takes the fifth first
    assert taken[:4] == [0, 0, 2, 2]
    assert [e[0] for e in cores["sink"].log] == ["note"] * 5 + ["bell"]


def test_collector_takes_its_deferred_inbox_when_it_could_end_every_request():
    import pytest

    from rack.serving.collector import Collector

    col = Collector(request_ids=[1, 2, 3])
    col.inbox.append(("event", (1, "arrival", 0.5)))
    col.inbox.append(("finish", (1, "completed", None, None, 1.0)))
    assert not col.all_ended() and len(col.inbox) == 2    # 2 messages < 3 open: left waiting
    col.inbox.append(("finish", (2, "rejected", "x", None, 1.5)))
    assert not col.all_ended() and not col.inbox          # 3 >= 3 open: taken, 1 still open
    assert col.open_requests() == [3]
    col.inbox.append(("finish", (3, "rejected", "x", None, 2.0)))
    assert col.all_ended() and not col.inbox              # ended at their own times
    col2 = Collector(request_ids=[7])
    col2.inbox.append(("finish", (7, "rejected", "x")))   # no time: not deferrable
    with pytest.raises(ValueError, match="needs its time"):
        col2.all_ended()


def test_replay_gc_tuning_is_restored():
    import gc

    from rack.runtime.virtual_run import _young_gc_only

    before = gc.get_threshold()
    with _young_gc_only():
        assert gc.get_threshold()[0] != before[0] and gc.get_freeze_count() > 0
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
    gc.freeze()                                 # a caller's own frozen objects stay frozen
    try:
        frozen = gc.get_freeze_count()
        with _young_gc_only():
            pass
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
