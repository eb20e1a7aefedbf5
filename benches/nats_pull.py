"""A plain nats-py JetStream pull consumer on the bench's stream: receive + ack, no writing.
Prints one line with msgs/s.

usage: nats_pull.py URL STREAM CONSUMER N
Creates the durable CONSUMER (explicit acks, 60 s AckWait, 10000 MaxAckPending — what subsink
creates with its defaults) and pulls batches of 1000 until N messages are acked.
"""
import asyncio
import sys
import time

import nats
from nats.js import api


async def main(url, stream, consumer, n):
    nc = await nats.connect(url)
    js = nc.jetstream()
    cfg = api.ConsumerConfig(
        durable_name=consumer,
        ack_policy=api.AckPolicy.EXPLICIT,
        ack_wait=60,
        max_ack_pending=10_000,
        deliver_policy=api.DeliverPolicy.ALL,
    )
    start = time.perf_counter()
    sub = await js.pull_subscribe("", durable=consumer, stream=stream, config=cfg)
    count = 0
    while count < n:
        try:
            msgs = await sub.fetch(batch=1000, timeout=1)
        except nats.errors.TimeoutError:
            continue
        for m in msgs:
            await m.ack()
        count += len(msgs)
    await nc.flush()
    secs = time.perf_counter() - start
    await nc.close()
    print(f"nats-py pull consumer: {count} msgs received and acked in {secs:.2f} s: {count / secs:,.0f} msgs/s")


if __name__ == "__main__":
    url, stream, consumer, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    asyncio.run(main(url, stream, consumer, n))
