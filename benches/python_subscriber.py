"""The official Python subscriber client (google-cloud-pubsub) on the bench's subscription: receive
+ ack, nothing written. usage: python_subscriber.py SUBSCRIPTION N  (PUBSUB_EMULATOR_HOST set)

Timed like subsink in benches/pubsub_drain.rs: from the first message received to the moment the
ack of the N-th message is handed to the transport. The client sends acks by unary Acknowledge
calls (batched by its dispatcher); the clock stops when the call that acks the N-th id starts.
Start-up (imports, channel, stream open) is not timed. Flow control is subsink's default: 10,000
messages, 100 MiB.

Prints one line: "python subscriber: RECEIVED received, ACKED acked in SECS s".
"""
import sys
import threading
import time

from google.cloud import pubsub_v1
from google.cloud.pubsub_v1.subscriber._protocol import streaming_pull_manager as spm

sub, n = sys.argv[1], int(sys.argv[2])
lock = threading.Lock()
done = threading.Event()
received = 0
acked = 0
first = None
last_ack = None

send_unary_ack = spm.StreamingPullManager.send_unary_ack


def counted_send_unary_ack(self, ack_ids, ack_reqs_dict):
    """The client's own ack call, with the ids it carries counted as it starts."""
    global acked, last_ack
    with lock:
        acked += len(ack_ids)
        if acked >= n and last_ack is None:
            last_ack = time.perf_counter()
            done.set()
    return send_unary_ack(self, ack_ids, ack_reqs_dict)


spm.StreamingPullManager.send_unary_ack = counted_send_unary_ack


def callback(message):
    global received, first
    with lock:
        if first is None:
            first = time.perf_counter()
        received += 1
    message.ack()


client = pubsub_v1.SubscriberClient()
flow = pubsub_v1.types.FlowControl(max_messages=10_000, max_bytes=100 * 1024 * 1024)
future = client.subscribe(sub, callback=callback, flow_control=flow)
done.wait(timeout=900)
future.cancel()
try:
    future.result(timeout=30)
except Exception:  # cancelled
    pass
secs = (last_ack - first) if last_ack is not None and first is not None else float("nan")
print(f"python subscriber: {received} received, {acked} acked in {secs:.3f} s", flush=True)
