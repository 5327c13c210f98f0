"""Attempts: launching rank 0, following it to its exit, timeouts, signals and cancellation.

One attempt runs at a time. An attempt is `running` from its launch until rank 0 has been reaped
and its output drained; only then do `wait` and log readers see it finished, so a finished
attempt's logs are complete. All state changes happen under `cond`, which every waiter waits on.
"""

from __future__ import annotations

import base64
import logging
import os
import signal
import subprocess
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

from firepool_agent import gpushare, hwfaults, kernel, kernel_report, overlimit, proctree, wiping
from firepool_agent.attempt import Attempt, Conflict, LaunchSpec, safe_name
from firepool_agent.config import AgentConfig
from firepool_agent.ledger import Ledger
from firepool_agent.output import STREAMS as LOG_STREAMS
from firepool_agent.output import Output, cap_of
from firepool_agent.prestart import Prestarted, Prestarter
from firepool_agent.reaping import Reaper

log = logging.getLogger(__name__)

REMEMBERED = 1000
"""Finished attempts whose status the agent keeps (a restarted broker asks about recent ones)."""
SIGNALS = {"INT": signal.SIGINT, "TERM": signal.SIGTERM, "HUP": signal.SIGHUP, "USR1": signal.SIGUSR1,
           "USR2": signal.SIGUSR2, "QUIT": signal.SIGQUIT, "KILL": signal.SIGKILL}


def job_of(attempt_id: str) -> str:
    """The job an attempt id belongs to: the broker names attempt n of job J `J:n` (`broker.jobs.attempt_id`)."""
    job, sep, n = attempt_id.rpartition(":")
    return job if sep and n.isdigit() else attempt_id


def busy_message(running: str, launching: str) -> str:
    """Why a launch waits: one attempt at a time, and never two attempts of one job (a re-queued attempt
    overlapping the predecessor the broker thought lost)."""
    if job_of(running) == job_of(launching):
        return (f"attempt {running} of the same job is still running: {launching} may start only once it has "
                "ended or was killed")
    return f"attempt {running} is running"


class Attempts:
    def __init__(self, config: AgentConfig, reaper: Reaper) -> None:
        self.config = config
        self.reaper = reaper
        self.cond = threading.Condition()
        self.launch_lock = threading.Lock()
        """Serialises launches and resets."""
        self.by_id: OrderedDict[str, Attempt] = OrderedDict()
        self.current: Attempt | None = None
        self.session: str | None = None
        self.launching: str | None = None
        """The session of the launch in progress once it crossed into it (set and cleared under the launch lock):
        a kernel binding its pre-started process waits for that process's imports, and the session's processes
        beside the job (exec, the terminal) need not wait with it (`sessionspawn`)."""
        self.attempts_dir = Path(config.run_dir) / "attempts"
        self.delivered: Any = None
        """The code package unpacked for the next launch (`binding.Delivered`); a reset forgets it."""
        self.prepare: Callable[[Attempt, LaunchSpec], LaunchSpec | tuple[str, str]] | None = None
        """Late binding before the spawn (`binding.prepare`): the launch to run, or (error class, message)."""
        self.prestarter = Prestarter(config, reaper, self.base_env)
        """The pod's pre-started kernel process, bound by a kernel launch (`prestart`)."""
        self.ledger: Ledger | None = None
        """The durable record of started attempt ids; written before anything of the attempt runs."""
        self._kept: Output | None = None
        """The one attempt output held in memory (`wait`'s `keep`)."""
        self._inline = False
        """The launch in progress (set under the launch lock) leaves its output's pump to its caller's `wait`."""

    # -- launching ------------------------------------------------------------------------------

    def base_env(self) -> dict[str, str]:
        """Every job's environment before its own parts (attempt id, request, GPU accounting)."""
        c = self.config
        return {"PATH": c.job_path, "HOME": c.workspace, "LANG": "C.UTF-8", "TMPDIR": c.tmp_dir,
                "FIREPOOL_WORKSPACE": c.workspace, "FIREPOOL_PACKAGE_DIR": c.package_dir,
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def job_env(self, requested: Mapping[str, str], attempt_id: str) -> dict[str, str]:
        """A fresh environment: the base, then the request on top; CUDA_VISIBLE_DEVICES is ours."""
        c = self.config
        env = {**self.base_env(), "FIREPOOL_ATTEMPT_ID": attempt_id, **requested}
        env["CUDA_VISIBLE_DEVICES"] = c.cuda_visible_devices
        env.update(gpushare.attempt_env(c.run_dir, c.cuda_visible_devices, safe_name(attempt_id)))
        return env

    def launch(self, spec: LaunchSpec, fence: Callable[[], None] | None = None, waits: bool = False) -> Attempt:
        """Start rank 0 and return once it has exec'd (or failed to: then it is finished, LaunchError).

        `fence` runs once the launch lock is held and may refuse (raise): a launch that waited for a reset or
        another launch is judged again against the newest broker term (`terms`), not the one of its arrival.
        `waits`: the caller calls `wait` with a wait next, which pumps the output itself while it waits."""
        with self.launch_lock:
            if fence is not None:
                fence()
            self._inline = waits
            try:
                return self._launch(spec)
            finally:
                self.launching = None

    def _launch(self, spec: LaunchSpec) -> Attempt:
        attempt = Attempt(spec.attempt_id, spec.session, self.attempts_dir / safe_name(spec.attempt_id))
        with self.cond:
            if self.current is not None:
                raise Conflict(busy_message(self.current.attempt_id, spec.attempt_id), retryable=True,
                               details={"running": self.current.attempt_id})
            if spec.attempt_id in self.by_id:
                raise Conflict(f"attempt {spec.attempt_id} was launched before")
            self.current = attempt
            self._remember(attempt)
        if self.ledger is not None:
            try:
                self.ledger.started(spec.attempt_id)
            except OSError as exc:  # unrecorded, it must not run: a crash test could not vouch for it
                self._fail(attempt, "LaunchError", f"the agent could not record the attempt: {exc}")
                return attempt
        self.prestarter.clean = False  # no process starts unbound again before a verified reset
        if not spec.extra.get("kernel") or spec.extra.get("requirements") is not None:
            # Nothing runs beside an unbound process: not another job, not a requirements install
            # (package builds run code), and the memory is the job's.
            self.prestarter.kill()
        if self.session is not None and spec.session != self.session:
            problems = self._cross_session(attempt)
            if problems:
                self._fail(attempt, "LaunchError", "the workspace of the previous session could not be "
                           "emptied: " + "; ".join(problems[:5]))
                return attempt
        self.session = spec.session
        if self.prepare is not None and spec.extra.keys() - {"max_output_bytes"}:  # the cap is the pump's
            prepared = self.prepare(attempt, spec)
            if isinstance(prepared, tuple):
                self._fail(attempt, *prepared)
                return attempt
            spec = prepared
        attempt.counters = overlimit.read_counters()
        self.launching = spec.session  # past the boundary and prepared: processes beside it may start now
        try:
            self._spawn(attempt, spec)
        except Exception as exc:  # never leave `current` set by an attempt that did not start
            self._fail(attempt, "LaunchError", f"the agent could not start the attempt: {exc!r}")
        return attempt

    def _cross_session(self, attempt: Attempt) -> list[str]:
        """A new session sees nothing of the last one: its processes die and its scratch is emptied."""
        began = time.perf_counter()
        problems = []
        kept = self._keep_prestarted(attempt)
        if [p for p in proctree.others() if p.pid != kept]:
            self.prestarter.kill()  # something else ran: nothing unbound crosses this boundary
            proctree.kill_all()
            problems += [f"process {p.pid} survived" for p in proctree.wait_gone(2.0)]
        for directory in self.scratch_dirs(workspace=True):
            problems += wiping.empty_dir(directory)
        attempt.timings["session_wipe_s"] = time.perf_counter() - began
        return problems

    def _keep_prestarted(self, attempt: Attempt) -> int | None:
        """Keep the unbound kernel across the boundary when it took nothing in (see `prestart`): its pid, or None."""
        if self.prestarter.current is None:
            return None
        reason = self.prestarter.crossing(self.prestarter.session_dirs())
        if reason is not None:
            log.info("%s: the pre-started kernel ends at the session boundary (%s)", attempt.attempt_id, reason)
            self.prestarter.kill()
            return None
        self.prestarter.crossed += 1
        attempt.timings["kernel_prestart_crossed"] = 1.0
        return self.prestarter.current.pid if self.prestarter.current is not None else None

    def scratch_dirs(self, workspace: bool) -> list[str]:
        """The directories a session may leave data in, beyond the package dir."""
        dirs = [self.config.workspace, self.config.tmp_dir] if workspace else []
        if self.config.isolated:
            dirs.append(self.config.shm_dir)  # private to this sandbox; the host's is never touched
        return dirs

    def _spawn(self, attempt: Attempt, spec: LaunchSpec) -> None:
        began = time.perf_counter()
        cwd = os.path.join(self.config.workspace, spec.cwd) if spec.cwd else self.config.workspace
        env = self.job_env(spec.env, spec.attempt_id)
        report: tuple[int, int] | None = None
        if spec.extra.get("kernel"):
            kernel.prepare_env(env)
            report = kernel_report.pipe(env)  # its connection line never goes through its stdout
            if self._bind_prestarted(attempt, spec, env, cwd, began, report):
                return
        output = Output(attempt.directory, self._notify, cap_of(spec.extra))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            with self.reaper.lock:
                attempt.started_at = time.time()
                try:
                    popen = subprocess.Popen(list(spec.argv), stdin=subprocess.DEVNULL, stdout=out_w, stderr=err_w,
                                             env=env, cwd=cwd, start_new_session=True, close_fds=True,
                                             pass_fds=(report[1],) if report else ())
                except (OSError, ValueError, subprocess.SubprocessError) as exc:
                    os.close(out_r)
                    os.close(err_r)
                    kernel_report.close(report)
                    self._fail(attempt, "LaunchError", f"cannot start {spec.argv[0]!r}: {exc}")
                    return
                # Popen returns after the child's exec succeeded: rank 0 is at its first instruction.
                attempt.first_instruction_at = time.time()
                overlimit.expose(popen.pid)
                attempt.pid = popen.pid
                attempt.popen = popen
                attempt.output = output
                self.reaper.watch(popen.pid, partial(self._exited, attempt))
        finally:
            os.close(out_w)
            os.close(err_w)
        attempt.timings["spawn_s"] = time.perf_counter() - began
        if report is not None and attempt.popen is not None:
            kernel_report.follow(attempt, report, self.cond)
        self._follow(attempt, spec, output, out_r, err_r)

    def _bind_prestarted(self, attempt: Attempt, spec: LaunchSpec, env: dict[str, str], cwd: str,
                         began: float, report: tuple[int, int]) -> bool:
        """Make the pod's pre-started kernel this attempt's rank 0; False (and nothing started) when it cannot."""
        if self.prestarter.current is None:
            attempt.timings["kernel_prestarted"] = 0.0
            return False
        ready = self.prestarter.current.ready_at is not None or bool(self.prestarter.current.messages(None))
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        attempt.started_at = time.time()
        try:
            bound = self.prestarter.bind(spec.argv, env, cwd, (out_w, err_w, report[1]))
        finally:
            os.close(out_w)
            os.close(err_w)
        if not isinstance(bound, Prestarted):
            os.close(out_r)
            os.close(err_r)
            log.info("%s: normal kernel launch (%s)", spec.attempt_id, bound)
            attempt.started_at = None
            attempt.timings["kernel_prestarted"] = 0.0
            return False
        attempt.first_instruction_at = time.time()
        kernel_report.follow(attempt, report, self.cond)
        output = Output(attempt.directory, self._notify, cap_of(spec.extra))
        overlimit.expose(bound.pid)
        with self.cond:
            attempt.pid = bound.pid
            attempt.popen = bound.popen
            attempt.output = output
        with bound.lock:
            early = bound.exit
            if early is None:
                bound.on_exit = partial(self._exited, attempt)
        if early is not None:  # it ended between its answer and now: the exit is this attempt's
            self._exited(attempt, *early)
        attempt.timings.update(spawn_s=time.perf_counter() - began, kernel_prestarted=1.0,
                               kernel_prestart_ready=1.0 if ready else 0.0,
                               kernel_prestart_age_s=time.monotonic() - bound.spawned_at)
        self._follow(attempt, spec, output, out_r, err_r)
        return True

    def _follow(self, attempt: Attempt, spec: LaunchSpec, output: Output, out_r: int, err_r: int) -> None:
        """Pump rank 0's output and arm the attempt's timeout."""
        output.pump(out_r, err_r, partial(self._drained, attempt), inline=self._inline)
        if spec.timeout_s is not None:
            attempt.timer = threading.Timer(spec.timeout_s, self._time_out, args=(attempt,))
            attempt.timer.daemon = True
            attempt.timer.start()

    def _fail(self, attempt: Attempt, error_class: str, message: str) -> None:
        with self.cond:
            attempt.error_class = error_class
            attempt.message = message
            attempt.finished_at = time.time()
            self._finish(attempt)

    # -- following the exit ---------------------------------------------------------------------

    def _exited(self, attempt: Attempt, status: int, reaped_at: float) -> None:
        code = os.waitstatus_to_exitcode(status)
        with self.cond:
            if attempt.popen is not None:
                attempt.popen.returncode = code  # so Popen never waits on a pid the reaper took
            attempt.wait_status = status
            attempt.finished_at = reaped_at
            if code < 0:
                attempt.signal = -code
                attempt.exit_code = 128 - code
            else:
                attempt.exit_code = code
            if attempt.output is not None:
                attempt.output.exited_at = time.monotonic()
            if attempt.drained:
                self._finish(attempt)

    def _drained(self, attempt: Attempt) -> None:
        with self.cond:
            attempt.drained = True
            if attempt.wait_status is not None:
                self._finish(attempt)

    def _finish(self, attempt: Attempt) -> None:
        """Called under `cond`: the attempt is over and its logs are complete."""
        attempt.running = False
        self._classify_limit(attempt)
        self._classify_hardware(attempt)
        if attempt.output is not None and attempt.output.error and not attempt.message:
            attempt.message = attempt.output.error
        if attempt.timer is not None:
            attempt.timer.cancel()
        attempt.kernel = None  # the kernel is gone: its keys open nothing, and the agent keeps no secret longer
        if self.current is attempt:
            self.current = None
        self.cond.notify_all()

    def _classify_limit(self, attempt: Attempt) -> None:
        """A failed attempt that hit the pod's memory, pids or disk cap fails with that typed error."""
        if attempt.error_class or attempt.timed_out or attempt.cancelled or attempt.exit_code in (0, None):
            return
        c = self.config
        capped = [c.workspace, c.tmp_dir, "/dev/shm", c.package_dir, *([c.deps_dir] if c.deps_dir else [])]
        found = overlimit.classify(attempt.counters, overlimit.read_counters(), capped, attempt.directory / "stderr")
        if found is None:
            return
        attempt.error_class = found
        attempt.oom = found == overlimit.OUT_OF_MEMORY
        attempt.message = {overlimit.OUT_OF_MEMORY: "the pod's memory limit was hit; the kernel killed a process",
                           overlimit.TOO_MANY_PROCESSES: "the pod's process limit (pids) refused a fork",
                           overlimit.DISK_FULL: "a capped disk (workspace, /tmp or /dev/shm) is full"}[found]

    def _classify_hardware(self, attempt: Attempt) -> None:
        """A failed attempt whose stderr or NVML names a hardware fault says so (the broker counts it)."""
        if attempt.cancelled or attempt.timed_out or attempt.exit_code in (0, None):
            return
        attempt.hardware_fault = hwfaults.classify(hwfaults.read_tail(attempt.directory / "stderr"),
                                                   attempt.exit_code)

    def _notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def _remember(self, attempt: Attempt) -> None:
        self.by_id[attempt.attempt_id] = attempt
        while len(self.by_id) > REMEMBERED:
            oldest = next(iter(self.by_id.values()))
            if oldest.running:
                break
            self.by_id.popitem(last=False)

    # -- asking and steering --------------------------------------------------------------------

    def get(self, attempt_id: str) -> Attempt | None:
        with self.cond:
            return self.by_id.get(attempt_id)

    def wait(self, attempt: Attempt, wait_s: float, inline_logs: int = 0, keep: bool = False) -> dict[str, Any]:
        """The attempt's status once it finished or `wait_s` passed; a finished attempt whose logs
        total at most `inline_logs` bytes carries them (base64), sparing the broker a read per stream.

        `keep`: logs that came inline stay in memory, served as before once a reset wiped their files, until
        another attempt's are kept. A broker that takes over from one killed between this answer and storing
        the logs still finds them (the broker that got them launches nothing more here before storing them)."""
        deadline = time.monotonic() + wait_s
        if wait_s > 0 and attempt.output is not None:
            attempt.output.pump_for(wait_s)  # held for this wait by `launch(waits=True)`: no thread for a short job
        with self.cond:
            if wait_s > 0:
                self.cond.wait_for(lambda: not attempt.running, timeout=max(0.0, deadline - time.monotonic()))
            status = attempt.to_json()
            output = attempt.output
            small = output is not None and not attempt.running and sum(
                output.sizes[s] for s in LOG_STREAMS) <= inline_logs
        if small and output is not None:
            try:
                logs = {s: output.read(s, 0, inline_logs) for s in LOG_STREAMS}
            except FileNotFoundError:
                return status  # a reset wiped them (the broker that reset the pod had copied them)
            status["logs"] = {s: base64.b64encode(data).decode() for s, data in logs.items()}
            if keep:
                if self._kept is not None and self._kept is not output:
                    self._kept.kept = None
                output.kept, self._kept = logs, output
        return status

    def read_log(self, attempt: Attempt, stream: str, offset: int, max_bytes: int,
                 wait_s: float) -> tuple[bytes, int, bool]:
        """(data, next offset, complete); with `wait_s`, block until bytes past `offset` or the end."""
        output = attempt.output
        with self.cond:
            if output is not None and wait_s > 0:
                self.cond.wait_for(lambda: output.sizes[stream] > offset or not attempt.running, timeout=wait_s)
            running = attempt.running
            size = output.sizes[stream] if output is not None else 0
        data = output.read(stream, offset, max_bytes) if output is not None else b""
        next_offset = offset + len(data)
        return data, next_offset, not running and next_offset >= size

    def send_signal(self, attempt: Attempt, name: str) -> None:
        """Signal rank 0's process group; KILL takes every process of the attempt."""
        with self.cond:
            if not attempt.running or attempt.pid is None:
                return
            pid = attempt.pid
        if name == "KILL":
            proctree.kill_all()
            return
        try:
            os.killpg(pid, SIGNALS[name])
        except (ProcessLookupError, PermissionError):
            pass

    def cancel(self, attempt: Attempt, grace_s: float) -> None:
        """TERM every process of the attempt now, KILL them if it has not ended after `grace_s`."""
        with self.cond:
            if not attempt.running or attempt.pid is None:
                return
            attempt.cancelled = True
        proctree.signal_all(signal.SIGTERM)
        threading.Thread(target=self._kill_after, args=(attempt, grace_s), name="cancel", daemon=True).start()

    def _kill_after(self, attempt: Attempt, grace_s: float) -> None:
        with self.cond:
            ended = self.cond.wait_for(lambda: not attempt.running, timeout=grace_s)
        if not ended:
            proctree.kill_all()

    def _time_out(self, attempt: Attempt) -> None:
        with self.cond:
            if not attempt.running:
                return
            attempt.timed_out = True
        proctree.kill_all()

    def settle(self, timeout_s: float) -> bool:
        """Wait until no attempt is running (after its processes were killed); True when none is."""
        with self.cond:
            return self.cond.wait_for(lambda: self.current is None, timeout=timeout_s)

    def forget_session(self) -> None:
        self.session = None
