"""A toy training loop instrumented with mxprof.

Fits y = 3x + 2 by gradient descent, with a data-loading thread feeding
batches through a queue.  Every phase is a task, each step a frame, the
bytes loaded a counter, and each epoch ends with a marker.  It writes a
Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing), its
HTML report beside it (``<trace stem>.report.html``, one page that opens in
any browser, offline) and prints the statistics table.

    python examples/quickstart.py [trace.json] [--slow-backward]

``--slow-backward`` computes the gradients three times over: the same
program with one phase slower, for ``mxprof diff`` to find.
"""

import os
import queue
import random
import sys
import threading

import mxprof as profiler

EPOCHS = 3
STEPS = 40
BATCH = 256

args = [a for a in sys.argv[1:] if a != "--slow-backward"]
BACKWARD_PASSES = 3 if "--slow-backward" in sys.argv[1:] else 1
trace_path = args[0] if args else "quickstart_trace.json"
profiler.set_config(filename=trace_path, aggregate_stats=True, dump_period=0.5)

train = profiler.Domain("train")
data = profiler.Domain("data")
load_task = data.new_task("load_batch")
bytes_loaded = data.new_counter("bytes_loaded", 0)
forward = train.new_task("forward")
backward = train.new_task("backward")
update = train.new_task("update")
step_frame = train.new_frame("step")
epoch_done = train.new_marker("epoch_end")


def loader(batches: "queue.Queue[list[tuple[float, float]] | None]", n: int) -> None:
    rng = random.Random(0)
    for _ in range(n):
        with load_task:
            batch = []
            for _ in range(BATCH):
                x = rng.uniform(-1, 1)
                batch.append((x, 3 * x + 2 + rng.gauss(0, 0.1)))
            bytes_loaded.increment(16 * BATCH)  # two float64 per sample
        batches.put(batch)
    batches.put(None)


@forward
def predict(w: float, b: float, batch: list[tuple[float, float]]) -> list[float]:
    return [w * x + b for x, _ in batch]


def main() -> None:
    w, b, lr = 0.0, 0.0, 0.5
    batches: queue.Queue[list[tuple[float, float]] | None] = queue.Queue(maxsize=4)
    producer = threading.Thread(target=loader, args=(batches, EPOCHS * STEPS), name="data-loader")
    profiler.set_state("run")
    producer.start()
    for epoch in range(EPOCHS):
        loss = 0.0
        for _ in range(STEPS):
            with step_frame:
                batch = batches.get()
                assert batch is not None
                preds = predict(w, b, batch)
                with backward:
                    for _ in range(BACKWARD_PASSES):
                        errs = [p - y for p, (_, y) in zip(preds, batch)]
                        grad_w = 2 * sum(e * x for e, (x, _) in zip(errs, batch)) / len(batch)
                        grad_b = 2 * sum(errs) / len(batch)
                        loss = sum(e * e for e in errs) / len(batch)
                update.start()
                w -= lr * grad_w
                b -= lr * grad_b
                update.stop()
        epoch_done.mark("process")
        print(f"epoch {epoch}: loss {loss:.4f}  w {w:.3f}  b {b:.3f}")
    producer.join()
    profiler.set_state("stop")
    profiler.dump()
    print(profiler.dumps(sort_by="total"))
    print(f"trace written to {trace_path}")
    page = os.path.splitext(trace_path)[0] + ".report.html"
    print(f"report written to {profiler.report(trace_path, page)}")


if __name__ == "__main__":
    main()
