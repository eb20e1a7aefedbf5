"""The Kafka bench's peers (benches/kafka_drain.rs), with confluent-kafka (librdkafka):

    kafka_consume.py produce BROKERS TOPIC N PARTITIONS   N x 1 KiB records, 3 headers, one
                                                          record per batch (see `produce`)
    kafka_consume.py consume BROKERS TOPIC GROUP N        a group consumer that only consumes and
                                                          commits (every 10,000 records and at
                                                          the end, synchronously); prints its rate
    kafka_consume.py fetch BROKERS TOPIC N PARTITIONS     assigned partitions, no group, no
                                                          commits: the broker's ceiling
"""
import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def produce(brokers, topic, n, partitions):
    # One record per batch: Tansu 0.6.0 skips the rest of a record batch when a consumer fetches
    # from an offset inside it, which a librdkafka consumer does after pausing and resuming a
    # partition (flow control). Measured here with a confluent-kafka consumer that pauses every
    # third poll: 84,803 of 100,000 records received, all 100,000 without pauses. Every reader
    # in the bench reads the same topic, so the ceiling below is this topic's.
    p = Producer({"bootstrap.servers": brokers, "acks": "all", "linger.ms": 0,
                  "batch.num.messages": 1, "enable.idempotence": False,
                  "queue.buffering.max.messages": 100000})
    payload = b"p" * 1024
    for i in range(n):
        headers = [("source", b"bench"), ("tenant", f"t-{i % 100}".encode()), ("type", b"event.v1")]
        while True:
            try:
                p.produce(topic, value=payload, key=f"k{i}".encode(), headers=headers,
                          partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        p.poll(0)
    assert p.flush(900) == 0


def consume(brokers, topic, group, n):
    c = Consumer({"bootstrap.servers": brokers, "group.id": group,
                  "auto.offset.reset": "earliest", "enable.auto.commit": False,
                  "partition.assignment.strategy": "cooperative-sticky"})
    c.subscribe([topic])
    start = time.time()
    got = 0
    uncommitted = 0
    while got < n:
        msgs = c.consume(1000, 1.0)
        k = sum(1 for m in msgs if not m.error())
        got += k
        uncommitted += k
        if got and got % 10000 < k:
            c.commit(asynchronous=False)
            uncommitted = 0
    if uncommitted:
        c.commit(asynchronous=False)
    secs = time.time() - start
    c.close()
    print(f"confluent-kafka group consumer (consume + commit): {n / secs:,.0f} msgs/s")


def fetch(brokers, topic, n, partitions):
    c = Consumer({"bootstrap.servers": brokers, "group.id": "unused", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    start = time.time()
    got = 0
    while got < n:
        got += sum(1 for m in c.consume(1000, 1.0) if not m.error())
    secs = time.time() - start
    c.close()
    print(f"confluent-kafka fetch only (the broker's ceiling): {n / secs:,.0f} msgs/s")


if __name__ == "__main__":
    cmd, a = sys.argv[1], sys.argv[2:]
    if cmd == "produce":
        produce(a[0], a[1], int(a[2]), int(a[3]))
    elif cmd == "consume":
        consume(a[0], a[1], a[2], int(a[3]))
    elif cmd == "fetch":
        fetch(a[0], a[1], int(a[2]), int(a[3]))
