"""Kafka from the outside, for tests/kafka.rs: confluent-kafka (librdkafka's Python client, not
subsink's code) produces records, reads a topic back, asks a group's committed offsets and sets
them (as an operator resetting a group would, or a crash that lost a worker's commits).

    kafka_tool.py produce BROKERS TOPIC        records as JSON lines on stdin (see `produce`)
    kafka_tool.py numbered BROKERS TOPIC FROM N SIZE PARTITIONS [PER_BATCH]
    kafka_tool.py read BROKERS TOPIC N          the first N records of TOPIC, as JSON (waits)
    kafka_tool.py all BROKERS TOPIC PARTITIONS  every record of TOPIC (until 3 s bring none)
    kafka_tool.py committed BROKERS GROUP TOPIC PARTITIONS
    kafka_tool.py commit BROKERS GROUP TOPIC OFFSETS   OFFSETS: JSON {"PARTITION": OFFSET}
"""
import base64
import json
import sys
import time

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)


def b64d(v):
    return None if v is None else base64.b64decode(v)


def b64e(v):
    return None if v is None else base64.b64encode(v).decode()


def producer(brokers, **extra):
    conf = {"bootstrap.servers": brokers, "acks": "all", "enable.idempotence": False}
    conf.update(extra)
    return Producer(conf)


def delivered(errors):
    def cb(err, _msg):
        if err is not None:
            errors.append(str(err))

    return cb


def produce(brokers, topic):
    """Each stdin line: {"value": b64|null, "key": b64|null, "headers": [[k, b64|null], ...],
    "partition": n, "timestamp": ms}."""
    p = producer(brokers)
    errors = []
    n = 0
    for line in sys.stdin:
        r = json.loads(line)
        kw = {}
        if "partition" in r:
            kw["partition"] = r["partition"]
        if "timestamp" in r:
            kw["timestamp"] = r["timestamp"]
        p.produce(
            topic,
            value=b64d(r.get("value")),
            key=b64d(r.get("key")),
            headers=[(k, b64d(v)) for k, v in r.get("headers", [])],
            on_delivery=delivered(errors),
            **kw,
        )
        n += 1
        p.poll(0)
    left = p.flush(60)
    assert left == 0 and not errors, (left, errors[:3])
    print(n)


def numbered(brokers, topic, start, n, size, partitions, per_batch=None):
    """Records `start..start+n`: header `i`, key `k{i}`, value `i` padded with `x` to `size`,
    partition `i % partitions`. `per_batch`: records per produced batch (1: every record its own
    batch, flushed one at a time; more: batches of that many, librdkafka waiting up to 1 s to fill
    one)."""
    extra = {"linger.ms": 5}
    if per_batch:
        extra["batch.num.messages"] = per_batch
    if per_batch and per_batch > 1:
        extra["linger.ms"] = 1000
    p = producer(brokers, **extra)
    errors = []
    for i in range(start, start + n):
        v = str(i).encode()
        v = v + b"x" * max(0, size - len(v))
        while True:
            try:
                p.produce(
                    topic,
                    value=v,
                    key=f"k{i}".encode(),
                    headers=[("i", str(i).encode())],
                    partition=i % partitions,
                    on_delivery=delivered(errors),
                )
                break
            except BufferError:
                p.poll(0.05)
        if per_batch == 1:
            p.flush(30)
        else:
            p.poll(0)
    left = p.flush(60)
    assert left == 0 and not errors, (left, errors[:3])
    print(n)


def record(m):
    return {
        "partition": m.partition(),
        "offset": m.offset(),
        "key": b64e(m.key()),
        "value": b64e(m.value()),
        "headers": [[k, b64e(v)] for k, v in (m.headers() or [])],
        # (type, ms): the producer's create time unless the topic sets log-append time.
        "timestamp": m.timestamp()[1],
    }


def read(brokers, topic, n):
    """Every partition assigned from offset 0, without joining a group: nisshi holds a JoinGroup
    for half the session timeout (22.5 s by default)."""
    c = Consumer(
        {
            "bootstrap.servers": brokers,
            "group.id": f"reader-{time.time_ns()}",
            "enable.auto.commit": False,
        }
    )
    parts = c.list_topics(topic, timeout=30).topics[topic].partitions
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    out = []
    deadline = time.time() + 60
    while len(out) < n and time.time() < deadline:
        m = c.poll(0.5)
        if m is None or m.error():
            continue
        out.append(record(m))
    c.close()
    print(json.dumps(out))


def read_all(brokers, topic, partitions, idle=3.0):
    """Every record of partitions 0..PARTITIONS from offset 0, for a topic whose record count is
    not known (duplicates): read until IDLE seconds pass without a record (60 s for the first).
    Not to the partitions' high watermarks: Tansu 0.6.0 answers the last record batch's base
    offset + 1 for it (1 for a partition holding one batch of 100 records)."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": f"reader-{time.time_ns()}"})
    c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    out = []
    last = time.time()
    while time.time() - last < (idle if out else 60):
        m = c.poll(0.2)
        if m is None or m.error():
            continue
        out.append(record(m))
        last = time.time()
    c.close()
    print(json.dumps(out))


def committed(brokers, group, topic, partitions):
    c = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False})
    tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=30)
    c.close()
    print(json.dumps({str(tp.partition): tp.offset for tp in tps}))


def commit(brokers, group, topic, offsets):
    """Set GROUP's committed offsets. First outside the group (no member id, generation -1), which
    a group without members accepts. A group that still lists a member killed earlier refuses that
    (nisshi: UNKNOWN_MEMBER_ID; it drops a dead member only when another one joins), so then as a
    member: join (its join removes the dead one), commit within the generation, leave. The group
    must be one of subsink's (cooperative-sticky)."""
    tps = [TopicPartition(topic, int(p), int(o)) for p, o in json.loads(offsets).items()]
    c = Consumer({"bootstrap.servers": brokers, "group.id": group, "enable.auto.commit": False})
    try:
        done = c.commit(offsets=tps, asynchronous=False)
    except KafkaException as e:
        if e.args[0].code() not in (KafkaError.UNKNOWN_MEMBER_ID, KafkaError.ILLEGAL_GENERATION):
            raise
        done = None
    c.close()
    if done is None:
        c = Consumer(
            {
                "bootstrap.servers": brokers,
                "group.id": group,
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 500,
                # subsink's: a group's members must share one.
                "partition.assignment.strategy": "cooperative-sticky",
            }
        )
        c.subscribe([topic])
        deadline = time.time() + 60
        while not c.assignment():
            if time.time() > deadline:
                sys.exit(f"commit {group}: no assignment within 60 s of joining")
            c.poll(0.1)
        done = c.commit(offsets=tps, asynchronous=False)
        c.close()
    for tp in done:
        if tp.error is not None:
            sys.exit(f"commit {tp.topic}/{tp.partition}: {tp.error}")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "produce":
        produce(*args)
    elif cmd == "numbered":
        numbered(args[0], args[1], *map(int, args[2:]))
    elif cmd == "read":
        read(args[0], args[1], int(args[2]))
    elif cmd == "all":
        read_all(args[0], args[1], int(args[2]))
    elif cmd == "committed":
        committed(args[0], args[1], args[2], int(args[3]))
    elif cmd == "commit":
        commit(*args)
    else:
        sys.exit(f"unknown command {cmd}")
