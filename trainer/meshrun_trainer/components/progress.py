"""Progress reporting on rank 0: a JSON line per step, /metrics and /progress over HTTP,
TensorBoard event files, and the final summary written to the pod's termination message
(docs/env-contract.md)."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)

from meshrun.envcontract import metrics_dir
from meshrun.jobdoc import JobDocument
from meshrun_trainer.components.eventlog import EventLog
from meshrun_trainer.runner import StepRecord

TERMINATION_MESSAGE_LIMIT = 4096
"""Kubernetes truncates termination messages beyond 4096 bytes (core/v1 Container docs)."""


def finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float replaced by None (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def finite_json(value: Any) -> str:
    """Strict JSON of ``value`` (non-finite numbers as null): what every reader can parse."""
    return json.dumps(finite(value), allow_nan=False)


class Metrics:
    """Prometheus series of one trainer (rank 0)."""

    def __init__(self, job: JobDocument) -> None:
        self.registry = CollectorRegistry()
        labels = {"job": job.pod.job_name, "namespace": job.pod.namespace}
        names = list(labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=self.registry)

        self.step = gauge("meshrun_trainer_step", "Last completed optimizer step").labels(**labels)
        self.total = gauge("meshrun_trainer_total_steps", "Steps the job will run").labels(**labels)
        self.loss = gauge("meshrun_trainer_loss", "Loss of the last step").labels(**labels)
        self.tps = gauge("meshrun_trainer_tokens_per_second", "Tokens/s of the last step").labels(
            **labels
        )
        self.step_time = gauge(
            "meshrun_trainer_step_time_seconds", "Wall time of the last step"
        ).labels(**labels)
        self.memory = gauge("meshrun_trainer_peak_memory_bytes", "Rank 0 peak memory").labels(
            **labels
        )
        self.eval_loss = gauge(
            "meshrun_trainer_eval_loss", "Validation loss of the last evaluation"
        ).labels(**labels)
        self.eval_step = gauge(
            "meshrun_trainer_eval_step", "Step of the last evaluation (0: before training)"
        ).labels(**labels)
        self.tokens = Counter(
            "meshrun_trainer_tokens", "Tokens trained on", names, registry=self.registry
        ).labels(**labels)
        self.total.set(job.spec.training.steps)


IDLE_SECONDS = 60.0
"""How long the progress server keeps a connection nobody sends on."""


class ProgressServer:
    """Serves /metrics (Prometheus text) and /progress (JSON) from a daemon thread."""

    def __init__(self, port: int, metrics: Metrics, progress: dict[str, Any]) -> None:
        registry, state, lock = metrics.registry, progress, threading.Lock()
        self.lock = lock

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.1: the operator keeps its connection and asks again on it every few
            # seconds, instead of a new connection each time; one idle past ``timeout`` is
            # closed (a client that holds connections open holds no thread for long).
            protocol_version = "HTTP/1.1"
            timeout = IDLE_SECONDS

            def do_GET(self) -> None:
                if self.path.startswith("/metrics"):
                    body, kind = generate_latest(registry), CONTENT_TYPE_LATEST
                elif self.path.startswith("/progress"):
                    with lock:
                        body, kind = finite_json(state).encode(), "application/json"
                else:
                    self.send_error(404, "try /metrics or /progress")
                    return
                self.send_response(200)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # keep stdout for the JSON step lines

        self.httpd = ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Reporter:
    """Rank 0's view of the run: prints, serves and finally writes the summary."""

    def __init__(self, job: JobDocument, serve: bool = True) -> None:
        self.job = job
        self.metrics = Metrics(job)
        self.progress: dict[str, Any] = {
            "step": 0,
            "totalSteps": job.spec.training.steps,
            "loss": None,
            "tokensPerSecond": None,
            "stepTimeSeconds": None,
            "updatedAt": time.time(),
        }
        folder = metrics_dir(job.spec, job.pod.checkpoint_dir)
        self.events = EventLog(folder, job) if folder else None
        self.server: ProgressServer | None = None
        if serve and job.pod.metrics_port:
            try:
                self.server = ProgressServer(job.pod.metrics_port, self.metrics, self.progress)
            except OSError as error:  # a busy port must not stop training
                print(f"meshrun-trainer: metrics server disabled: {error}", file=sys.stderr)

    def on_step(self, record: StepRecord) -> None:
        m = self.metrics
        m.step.set(record.step)
        m.loss.set(record.loss)
        m.tps.set(record.tokens_per_s)
        m.step_time.set(record.step_time_s)
        m.memory.set(record.peak_memory_bytes)
        m.tokens.inc(self.job.spec.tokens_per_step)
        update = {
            "step": record.step,
            "loss": record.loss,
            "tokensPerSecond": record.tokens_per_s,
            "stepTimeSeconds": record.step_time_s,
            "updatedAt": time.time(),
        }
        lock = self.server.lock if self.server else threading.Lock()
        with lock:
            self.progress.update(update)
        line = {
            "event": "step",
            **update,
            "totalSteps": self.job.spec.training.steps,
            "gradNorm": record.grad_norm,
            "peakMemoryBytes": record.peak_memory_bytes,
        }
        print(finite_json(line), flush=True)
        if self.events is not None:
            self.events.step(record)

    def on_eval(self, step: int, loss: float) -> None:
        """A validation loss: a JSON line, the gauges, and /progress (evalLoss, evalStep)."""
        self.metrics.eval_loss.set(loss)
        self.metrics.eval_step.set(step)
        lock = self.server.lock if self.server else threading.Lock()
        with lock:
            self.progress.update({"evalLoss": loss, "evalStep": step})
        print(finite_json({"event": "eval", "step": step, "loss": loss}), flush=True)
        if self.events is not None:
            self.events.evaluation(step, loss)

    def close_events(self) -> None:
        """Write out what the event files hold (also when training stopped on an error)."""
        if self.events is not None:
            self.events.close()

    def finish(self, summary: dict[str, Any]) -> None:
        """Print the summary line and write the compact termination message."""
        print(finite_json({"event": "summary", **summary}), flush=True)
        self.close_events()
        brief = {k: v for k, v in summary.items() if k != "losses"}
        if "eval" in brief:  # the last evaluations: the message must stay whole JSON
            brief["eval"] = brief["eval"][-8:]
        text = finite_json(brief)[:TERMINATION_MESSAGE_LIMIT]
        try:
            with open(self.job.pod.termination_log, "w", encoding="utf-8") as handle:
                handle.write(text)
        except OSError as error:
            print(f"meshrun-trainer: cannot write termination log: {error}", file=sys.stderr)
        if self.server is not None:
            self.server.close()
