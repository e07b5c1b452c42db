#!/usr/bin/env python3
"""Soak test of files that other processes change while runs go (docs/shared-files.md).

Several slots run side by side, each with its own checkpoint folder and text data. A slot loops
over episodes until its run reaches train.steps: each episode starts the run (fresh, or
--resume latest once the folder holds a step) together with a duplicate of it 0-0.3 s later (a
scheduler's restart while the old job still runs), then at a random instant does one of: nothing,
SIGKILL, SIGTERM, a change to a data file the run reads (truncate, replace by rename, rewrite in
place, append; training or validation data), or a disk that fills under the checkpoint folder.
After each episode the data is restored and the folder checked: only complete step_* folders of
this slot's run. When the run completes, its final weights must equal, byte for byte, those of
an uninterrupted reference run of the same config; then the slot starts over.

Failures: a run that died of a signal it was not sent, an exit code or message the episode does
not explain, an incomplete or foreign step folder, a final model that differs from the reference.

    tests/soak/soak.py --binary build/remat-train --minutes 10 --slots 3 --seed 1

Exit status 0 when there was no failure. Python 3 standard library only.
"""
import argparse
import json
import os
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

STEPS = 200
EVERY = 10
DATA_CHANGES = ["truncate", "replace", "rewrite", "append"]


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.c = {k: 0 for k in ["runs started", "SIGKILLs", "SIGTERMs", "data changes",
                                 "disk fills", "disk-full exits", "lock refusals",
                                 "resume races", "data-change exits",
                                 "resumes verified bitwise", "completions without a resume",
                                 "failures"]}
        self.failures = []

    def add(self, key, n=1):
        with self.lock:
            self.c[key] += n

    def fail(self, slot, what):
        with self.lock:
            self.c["failures"] += 1
            self.failures.append(f"slot {slot}: {what}")
        print(f"[soak] FAILURE slot {slot}: {what}", flush=True)


def corpus_bytes(rng, n):
    words = [bytes(rng.choice(b"etaoinshrdlucmfwyp") for _ in range(rng.randint(2, 8)))
             for _ in range(200)]
    out = bytearray()
    while len(out) < n:
        out += rng.choice(words) + (b"\n" if rng.random() < 0.1 else b" ")
    return bytes(out[:n])


def write_atomic(path, data):
    tmp = path + ".restore"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def complete_steps(ck):
    if not os.path.isdir(ck):
        return []
    return sorted(n for n in os.listdir(ck) if re.fullmatch(r"step_\d+", n) and
                  os.path.isfile(os.path.join(ck, n, "state.json")))


class Slot:
    def __init__(self, soak, index):
        self.soak, self.i = soak, index
        self.dir = os.path.join(soak.scratch, f"slot{index}")
        os.makedirs(self.dir, exist_ok=True)
        rng = random.Random(soak.seed * 1000 + index)
        self.train_path = os.path.join(self.dir, "train.txt")
        self.val_path = os.path.join(self.dir, "val.txt") if index % 2 else None
        self.data = {self.train_path: corpus_bytes(rng, 48 << 10)}
        if self.val_path:
            self.data[self.val_path] = corpus_bytes(rng, 8 << 10)
        self.restore_data()
        self.ck = soak.disk_dir(index) or os.path.join(self.dir, "ck")
        self.seed = 100 + index
        self.rng = random.Random(soak.seed * 7919 + index)
        self.reference = None
        self.resumed = False

    def args(self, ck, resume):
        sets = [f"train.steps={STEPS}", f"train.seed={self.seed}",
                        f"data.path=\"{self.train_path}\"", f"checkpoint.dir=\"{ck}\"",
                        f"checkpoint.every={EVERY}"]
        if self.val_path:
            sets += [f"data.val_path=\"{self.val_path}\"", "train.eval_every=20",
                     "train.eval_tokens=256"]
        cmd = [self.soak.binary, "--config", self.soak.config, "-q"]
        for s in sets:
            cmd += ["--set", s]
        return cmd + (["--resume", "latest"] if resume else [])

    def restore_data(self):
        for path, data in self.data.items():
            write_atomic(path, data)

    def make_reference(self):
        ck = os.path.join(self.dir, "reference")
        shutil.rmtree(ck, ignore_errors=True)
        t0 = time.time()
        r = subprocess.run(self.args(ck, False), capture_output=True, text=True, env=self.soak.env)
        self.run_s = time.time() - t0  # actions land anywhere in a run of about this length
        if r.returncode != 0:
            raise SystemExit(f"[soak] the reference run of slot {self.i} failed:\n{r.stderr}")
        with open(os.path.join(ck, f"step_{STEPS:08d}", "model.safetensors"), "rb") as f:
            self.reference = f.read()

    # ---- one episode ----

    def start(self, resume, log, small_files):
        self.soak.counts.add("runs started")
        return subprocess.Popen(self.args(self.ck, resume), stdout=log, stderr=subprocess.STDOUT,
                                env=self.soak.env,
                                preexec_fn=self.soak.small_files if small_files else None)

    def wait_until_open(self, procs, path):
        """Whether a run holds `path` open (it read the data, so a change now is under it)."""
        while any(p.poll() is None for p in procs):
            for p in procs:
                try:
                    fds = os.listdir(f"/proc/{p.pid}/fd")
                    if any(os.readlink(f"/proc/{p.pid}/fd/{fd}") == path for fd in fds):
                        return True
                except OSError:
                    pass
            time.sleep(0.01)
        return False

    def change_data(self, kind, path):
        original = self.data[path]
        if kind == "truncate":
            open(path, "wb").close()
        elif kind == "replace":
            write_atomic(path, original[: len(original) // 2])
        elif kind == "rewrite":  # same size, other bytes, same inode
            with open(path, "r+b") as f:
                f.write(bytes(reversed(original[:4096])))
        else:
            with open(path, "ab") as f:
                f.write(b"appended while a run reads me\n" * 64)
        self.soak.counts.add("data changes")

    def episode(self):
        resume = bool(complete_steps(self.ck))
        self.resumed |= resume
        action = self.rng.choice(["none", "kill", "kill", "term", "data", "data"] +
                                 (["disk"] if self.soak.can_fill(self.i) else []))
        sent, filler = set(), None
        if action == "disk":
            filler = self.soak.fill_disk(self.i)
        logs = [tempfile.TemporaryFile(dir=self.dir) for _ in range(2)]
        small = action == "disk" and filler is None  # no tmpfs: RLIMIT_FSIZE stands in
        procs = [self.start(resume, logs[0], small)]
        time.sleep(self.rng.uniform(0, 0.3))
        procs.append(self.start(resume, logs[1], small))
        time.sleep(self.rng.uniform(0.05, 1.1 * self.run_s))
        if action in ("kill", "term"):
            sig = signal.SIGKILL if action == "kill" else signal.SIGTERM
            for p in procs:
                if p.poll() is None:
                    p.send_signal(sig)
                    sent.add((p.pid, sig))
                    self.soak.counts.add("SIGKILLs" if action == "kill" else "SIGTERMs")
        elif action == "data":
            # Only under a run that opened the file: data changed before a run starts is simply
            # its data (and would make it another run than the reference).
            path = self.rng.choice(sorted(self.data))
            if self.wait_until_open(procs, os.path.realpath(path)):
                self.change_data(self.rng.choice(DATA_CHANGES), path)
        for p in procs:
            try:
                p.wait(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                self.soak.counts.fail(self.i, f"a run hung (pid {p.pid}); killed")
        if action == "data":
            self.restore_data()
        if filler:
            os.remove(filler)
        done = False
        for p, log in zip(procs, logs):
            log.seek(0)
            text = log.read().decode(errors="replace")
            done |= self.judge(p, text, action, sent)
        self.check_folder()
        return done

    def judge(self, p, text, action, sent):
        """Whether the run completed; counts its outcome, or a failure it cannot explain."""
        rc = p.returncode
        if rc < 0 or rc > 128:
            sig = -rc if rc < 0 else rc - 128
            if (p.pid, sig) not in sent:
                self.soak.counts.fail(self.i, f"run died of signal {sig} it did not get:\n{text}")
            return False
        if rc == 0:
            return True
        if rc == 2 and "is in use by another run" in text:
            self.soak.counts.add("lock refusals")
            return False
        if rc == 2 and "appeared while this run started" in text:
            # --resume chose its folder before it took the lock, and the run that held the lock
            # wrote a newer step meanwhile: refused by design ("run the command again").
            self.soak.counts.add("resume races")
            return False
        if rc == 2 and "already holds checkpoints" in text:
            return False  # the duplicate of a fresh start, after the first one wrote a step
        if rc == 2 and action == "data" and "[data]" in text:
            if "changed while training" in text:
                self.soak.counts.add("data-change exits")
            return False
        if rc == 1 and action == "disk" and ("No space left" in text or "too large" in text):
            self.soak.counts.add("disk-full exits")
            return False
        self.soak.counts.fail(self.i, f"exit {rc} after action '{action}':\n{text}")
        return False

    def check_folder(self):
        for name in complete_steps(self.ck):
            with open(os.path.join(self.ck, name, "state.json")) as f:
                state = json.load(f)
            if f"seed = {self.seed}" not in state.get("config", ""):
                self.soak.counts.fail(self.i, f"{name} holds another run's config")

    def verify_complete_run(self, resumed):
        final = os.path.join(self.ck, f"step_{STEPS:08d}")
        for name in complete_steps(self.ck):  # every step verifies (sizes, checksums)
            r = subprocess.run([self.soak.binary, "sample", "--checkpoint",
                                os.path.join(self.ck, name), "--prompt", "a", "--tokens", "1"],
                               capture_output=True, text=True, env=self.soak.env)
            if r.returncode != 0:
                self.soak.counts.fail(self.i, f"{name} does not load:\n{r.stdout}{r.stderr}")
        try:
            with open(os.path.join(final, "model.safetensors"), "rb") as f:
                same = f.read() == self.reference
        except OSError as e:
            self.soak.counts.fail(self.i, f"no final checkpoint: {e}")
            return
        if not same:
            self.soak.counts.fail(self.i, "the final weights differ from the reference run")
        elif resumed:
            self.soak.counts.add("resumes verified bitwise")
        else:
            self.soak.counts.add("completions without a resume")

    def loop(self):
        self.make_reference()
        while time.time() < self.soak.deadline:
            for name in os.listdir(self.ck) if os.path.isdir(self.ck) else []:
                if name != ".lock":
                    shutil.rmtree(os.path.join(self.ck, name), ignore_errors=True)
            self.resumed = False
            for _ in range(200):
                if self.episode():
                    break
            else:
                self.soak.counts.fail(self.i, "200 episodes without completing the run")
                return
            self.verify_complete_run(self.resumed)


class Soak:
    def __init__(self, a):
        self.binary = os.path.abspath(a.binary)
        self.config = os.path.abspath(a.config)
        self.seed = a.seed
        self.scratch = tempfile.mkdtemp(prefix="remat-soak-", dir=a.scratch)
        self.counts = Counts()
        self.env = dict(os.environ, OMP_NUM_THREADS="1")
        self.mounts = {}
        self.fill = a.disk_fill
        self.deadline = time.time() + 60 * a.minutes
        self.slots = [Slot(self, i) for i in range(a.slots)]

    # ---- a disk that fills: a small tmpfs under slot 0's checkpoint folder, else RLIMIT_FSIZE ----

    def disk_dir(self, index):
        if index != 0 or not self.fill:
            return None
        mnt = os.path.join(self.scratch, "small-disk")
        os.makedirs(mnt, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", mnt],
                           capture_output=True, text=True)
        if r.returncode == 0:
            self.mounts[index] = mnt
            print(f"[soak] disk fills: slot 0 checkpoints on a 4 MiB tmpfs at {mnt}", flush=True)
            return os.path.join(mnt, "ck")
        why = (r.stderr.strip().splitlines() or ["not root"])[0]
        print(f"[soak] disk fills: cannot mount a tmpfs ({why}); "
              "using RLIMIT_FSIZE (files over 64 KiB fail with EFBIG) in its place", flush=True)
        return None

    def can_fill(self, index):
        return self.fill and index == 0

    def fill_disk(self, index):
        """Leaves a few KiB free on slot `index`'s disk; returns the filler to delete after."""
        self.counts.add("disk fills")
        if index not in self.mounts:
            return None  # RLIMIT_FSIZE: small_files applies it to this episode's runs
        filler = os.path.join(self.mounts[index], "filler")
        st = os.statvfs(self.mounts[index])
        with open(filler, "wb") as f:
            f.write(b"\0" * max(0, st.f_bavail * st.f_frsize - (16 << 10)))
        return filler

    @staticmethod
    def small_files():
        """In the child, before exec: writes past 64 KiB fail (EFBIG), as on a full disk."""
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))

    def run(self):
        threads = [threading.Thread(target=s.loop) for s in self.slots]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def close(self):
        for mnt in self.mounts.values():
            subprocess.run(["umount", mnt])
        shutil.rmtree(self.scratch, ignore_errors=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--binary", required=True)
    p.add_argument("--config", default=os.path.join(here, "soak.toml"))
    p.add_argument("--minutes", type=float, default=10)
    p.add_argument("--slots", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scratch", default=None)
    p.add_argument("--no-disk-fill", dest="disk_fill", action="store_false")
    a = p.parse_args()
    soak = Soak(a)
    t0 = time.time()
    try:
        soak.run()
    finally:
        soak.close()
    c = soak.counts.c
    print(f"[soak] {time.time() - t0:.0f} s, {a.slots} slots, seed {a.seed}:")
    for k, v in c.items():
        print(f"[soak]   {k}: {v}")
    for f in soak.counts.failures:
        print(f"[soak] failure: {f}")
    sys.exit(1 if c["failures"] else 0)


if __name__ == "__main__":
    main()
