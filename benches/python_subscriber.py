"""The official Python subscriber client alone on the bench's subscription: receive + ack, no
writing. Prints msgs/s. usage: python_subscriber.py SUBSCRIPTION N  (PUBSUB_EMULATOR_HOST set)"""
import sys
import threading
import time

from google.cloud import pubsub_v1

sub, n = sys.argv[1], int(sys.argv[2])
count = 0
lock = threading.Lock()
done = threading.Event()
start = None


def callback(message):
    global count, start
    message.ack()
    with lock:
        if start is None:
            start = time.perf_counter()
        count += 1
        if count >= n:
            done.set()


client = pubsub_v1.SubscriberClient()
flow = pubsub_v1.types.FlowControl(max_messages=10_000, max_bytes=100 * 1024 * 1024)
t0 = time.perf_counter()
future = client.subscribe(sub, callback=callback, flow_control=flow)
done.wait(timeout=600)
secs = time.perf_counter() - t0
future.cancel()
print(f"python subscriber: {count} msgs in {secs:.2f} s: {count / secs:,.0f} msgs/s (receive + ack)")
