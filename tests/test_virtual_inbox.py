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
