"""A consumer group whose member dies without leaving it (SIGKILL), with confluent-kafka alone
(librdkafka's Python client; no subsink): does the broker's group coordinator give the dead
member's partitions to the member that is left, once the dead one's session is over?

    kafka_dead_member.py BROKERS TOPIC PARTITIONS SESSION_MS STRATEGY ORDER
        STRATEGY: a partition.assignment.strategy (range, cooperative-sticky)
        ORDER: victim-last (the member killed joins after the one left) or victim-first
    kafka_dead_member.py member BROKERS TOPIC GROUP SESSION_MS STRATEGY     (one member; internal)

Each member is a process of its own that prints its assignment (a JSON list of partitions) each
time it changes. The first member is started and waits for every partition, the second joins and
both wait until the partitions are split between them; then the victim gets SIGKILL (it never
leaves the group) and the survivor is watched for SESSION_MS + 30 s. Prints one JSON object:
`reassigned` (the survivor held every partition by the end), `survivor` (its partitions at the
end), `victim` (what the victim held when killed), `seconds` (from the kill to the survivor
holding every partition, or null) and `events` (every assignment seen, with its time).
"""
import json
import os
import signal
import subprocess
import sys
import threading
import time


def member(brokers, topic, group, session_ms, strategy):
    from confluent_kafka import Consumer

    c = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": group,
            "session.timeout.ms": int(session_ms),
            "heartbeat.interval.ms": max(100, min(3000, int(session_ms) // 10)),
            "partition.assignment.strategy": strategy,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    last = None
    while True:
        c.poll(0.1)
        now = sorted(tp.partition for tp in c.assignment())
        if now != last:
            print(json.dumps(now), flush=True)
            last = now


class Member:
    """A member process, and its assignments as it prints them."""

    def __init__(self, name, brokers, topic, group, session_ms, strategy, events, start):
        self.name = name
        self.events = events
        self.start = start
        self.partitions = []
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "member", brokers, topic, group, str(session_ms), strategy],
            stdout=subprocess.PIPE,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            parts = json.loads(line)
            with self.lock:
                self.partitions = parts
                self.events.append([round(time.time() - self.start, 2), self.name, parts])

    def held(self):
        with self.lock:
            return list(self.partitions)


def wait(what, cond, limit):
    deadline = time.time() + limit
    while time.time() < deadline:
        if cond():
            return
        time.sleep(0.1)
    sys.exit(f"kafka_dead_member: {what} within {limit} s")


def main(brokers, topic, partitions, session_ms, strategy, order):
    partitions, session_ms = int(partitions), int(session_ms)
    every = list(range(partitions))
    group = f"dead-member-{time.time_ns()}"
    events, start = [], time.time()
    args = (brokers, topic, group, session_ms, strategy, events, start)
    members = []
    try:
        first_name, second_name = (
            ("survivor", "victim") if order == "victim-last" else ("victim", "survivor")
        )
        first = Member(first_name, *args)
        members.append(first)
        wait(f"the {first_name} holds every partition", lambda: first.held() == every, 60)
        second = Member(second_name, *args)
        members.append(second)
        split = lambda: (
            first.held()
            and second.held()
            and sorted(first.held() + second.held()) == every
        )
        wait("the partitions split between the two members", split, 60 + session_ms / 1000)
        survivor, victim = (first, second) if order == "victim-last" else (second, first)
        held_by_victim = victim.held()
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait()
        killed = time.time()
        events.append([round(killed - start, 2), "victim", "SIGKILL"])
        seconds = None
        deadline = killed + session_ms / 1000 + 30
        while time.time() < deadline:
            if survivor.held() == every:
                seconds = round(time.time() - killed, 2)
                break
            time.sleep(0.1)
        print(
            json.dumps(
                {
                    "reassigned": seconds is not None,
                    "survivor": survivor.held(),
                    "victim": held_by_victim,
                    "seconds": seconds,
                    "events": events,
                }
            )
        )
    finally:
        for m in members:
            if m.proc.poll() is None:
                m.proc.send_signal(signal.SIGKILL)
                m.proc.wait()


if __name__ == "__main__":
    if sys.argv[1] == "member":
        member(*sys.argv[2:])
    else:
        main(*sys.argv[1:])
        sys.stdout.flush()
        os._exit(0)
