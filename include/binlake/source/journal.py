"""The durable state of a log-reading source in its ``--data-dir``: the TSO
journal and the checkpoint.

Files:

``journal.log``
    Append-only JSON lines, fsync'ed before the step they announce:

    * ``{"k": KEY, "s": START_TS}`` written before the prewrite of the upstream
      transaction KEY is sent (with ``"ddl"``: the resulting table definitions,
      base64 TableInfo, so a re-read DDL yields the same definition);
    * ``{"k": KEY, "c": COMMIT_TS, "p": PUMP}`` written after that Pump
      acknowledged the prewrite, before the commit binlog is sent;
    * ``{"s": START_TS, "r": 1}`` a start_ts abandoned (rolled back).
    * ``{"b": [[KEY, START_TS], ...]}`` the start_ts of several transactions
      (a group of upstream transactions, ``source.pipeline``), written before
      any of their prewrites is sent: one line, one fsync;
    * ``{"m": [[KEY, COMMIT_TS, PUMP], ...]}`` several transactions decided
      together (a group, a snapshot): one line, so a crash decides all of them
      or none (a torn last line is read as never written).
    * ``{"f": START_TS}`` written by the start-up compaction: decisions at or
      below START_TS were compacted away (see *TxnStatus* below).
    * ``{"m": [...], "b": [...]}`` both in one line (one step of the pipeline:
      it decides one group and begins the next): still all or none; the
      decisions are applied first (their keys were begun by an earlier line).

    Invariant: a KEY is decided at most once: once it has a ``c`` line, every
    later copy of that transaction carries exactly that ``(start_ts, commit_ts)``;
    a start_ts without a ``c`` line never had a commit_ts minted, so it is safe
    to roll back.
``state.json``
    The checkpoint, replaced atomically (write, fsync, rename, fsync dir).
    Invariant: ``position`` is the end of an upstream transaction whose commit
    binlog a Pump acknowledged, and every transaction before it was
    acknowledged too; ``schema`` is the source's table definitions as of that
    position. It is never inside a transaction (the seed's savepoint rule).

``LOCK``
    Held (flock) while a source runs: two sources on one data dir would
    interleave their journals and checkpoints.

The recovery argument (kill -9 anywhere): on restart the source resumes at
``position``, so nothing after the last acknowledged transaction is lost.
A transaction re-read from the upstream log is looked up by its KEY (its
position in the upstream log, which never changes):

* with a ``c`` line: the same start_ts/commit_ts are re-sent to the same Pump
  (an AlreadyExists answer means the Pump has it); any copy downstream has
  equal ``(commit_ts, start_ts)``, which the reader and the ingest drop;
* with only an ``s`` line: no commit_ts was ever minted for it, so no Pump can
  serve it; the old start_ts is marked rolled back (the Pump that may hold its
  prewrite learns that through TxnStatus) and the transaction starts afresh.

TxnStatus: a Pump asks about a start_ts it holds a prewrite of and no commit
(the commit never came, or a power loss took it after the Pump acknowledged it:
Pumps acknowledge commits before their fsync). The answer must be the journaled
decision, whenever the Pump asks. Decisions are kept (the newest
``KEEP_DECIDED`` in the file, twice that in memory); the highest start_ts ever
dropped is remembered (``{"f": ...}``), and a start_ts at or below it that is
no longer known is answered RUNNING, never ROLLED_BACK: the Pump keeps the
prewrite pending (and its safe ts held) instead of dropping a transaction
that may have committed.

Unacknowledged commits: every decision line is written after every commit of
the line before it was acknowledged (``Emitter.emit`` and ``commit_group``
return only then; a pipeline step decides its group only after the batch
carrying the previous group's commits was answered). So after a kill -9 only
the last decision line's commits may never have reached their Pump. A stream
transaction among them is re-read from the checkpoint and re-sent, but a part
of a snapshot attempt that the restart abandons is never read again: its Pump
would hold the prewrite (and its safe ts, so every window after it) until it
asked TxnStatus after its txn timeout. The restart therefore re-sends the last
line's commits (``last_decided``) at once; a Pump that has one answers
AlreadyExists.

TSOs come from the registry in log order, so commit_ts order is the
upstream's commit order; a re-sent transaction keeps its old, still ordered, TSOs.

Groups (``source.pipeline``): a group's begins are one line and its
decisions one line (shared with the next group's begins), so the argument
above holds per group, all or none, and the decided transactions are always a
prefix of the log (groups are decided in order, one step at a time). A
crash (kill -9) inside a group:

* after its begin line, before its decision line (prewrites maybe on the
  Pumps): none of it is decided; at restart every one of its start_ts is an
  orphan, rolled back (TxnStatus says so to any Pump holding a prewrite), and
  the checkpoint is before the group, so all of it is re-read and sent afresh
  with new TSOs, still after every decided one;
* after its decision line, before (or during) its commits: all of it is
  decided; re-read from the checkpoint, every one of its transactions gets its
  commit re-sent with the journaled TSOs (copies, if the Pump had it, that
  the reader drops), and nothing of it is prewritten again;
* after its commits, before the checkpoint: as the previous case, with every
  re-sent commit a copy.

The checkpoint moves only after a group's commits are acknowledged, to the
end of its last transaction (``source.pipeline``), so ``position`` keeps its
invariant.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import pathlib
import threading
from typing import Any

from binlake import errors
from binlake.proto import binlog_pb2
from binlake.writer import txn_status

JOURNAL = "journal.log"
STATE = "state.json"
# Keep this many decided transactions when the journal is compacted at start:
# a Pump may still ask about a start_ts it holds on a second Pump (a retried
# prewrite) long after the checkpoint passed it.
KEEP_DECIDED = 100_000


class Decision:
    __slots__ = ("commit_ts", "ddl", "pump", "start_ts")

    def __init__(self, start_ts: int) -> None:
        self.start_ts = start_ts
        self.commit_ts = 0
        self.pump = ""
        self.ddl: list[binlog_pb2.TableInfo] | None = None


class SourceState:
    """``journal.log`` + ``state.json`` in ``data_dir``; also the TxnStatus provider."""

    def __init__(self, data_dir: str | os.PathLike[str]) -> None:
        self.dir = pathlib.Path(data_dir)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise errors.InvalidArgument(f"cannot use --data-dir {self.dir}: {exc}") from None
        self._lockfile = (self.dir / "LOCK").open("a")
        try:
            fcntl.flock(self._lockfile.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lockfile.close()
            raise errors.FailedPrecondition(
                f"another source is running on --data-dir {self.dir}; stop it first, or use another data dir"
            ) from None
        self._lock = threading.Lock()
        self._by_key: dict[str, Decision] = {}
        self._by_start: dict[int, Decision] = {}
        self._rolled_back: set[int] = set()
        # The highest start_ts whose decision was dropped (memory trim or compaction).
        self._forgotten_upto = 0
        # The start_ts this start found begun and never decided (a killed run's): rolled
        # back in the journal below; the source also tells the Pumps (``Emitter``).
        self.orphaned: list[int] = []
        # The transactions of the journal's last decision line, (start_ts, commit_ts, pump):
        # the only ones whose commits a killed run may not have had acknowledged (see
        # *Unacknowledged commits* in the module docstring); ``Emitter`` re-sends them.
        self.last_decided: list[tuple[int, int, str]] = []
        self.state: dict[str, Any] = self._load_state()
        self._load_journal()
        self._journal = (self.dir / JOURNAL).open("a", encoding="utf-8")

    # -- checkpoint
    def _load_state(self) -> dict[str, Any]:
        path = self.dir / STATE
        if not path.exists():
            return {}
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise errors.FailedPrecondition(f"checkpoint {path} is unreadable ({exc}); it is written atomically, "
                                            "so this is damage from outside: restore it or use a new --data-dir") from None

    def save(self, **fields: Any) -> None:
        """Replace the checkpoint atomically with the current state plus ``fields``."""
        self.state.update(fields)
        tmp = self.dir / (STATE + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(self.state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.dir / STATE)
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- journal
    def _load_journal(self) -> None:
        path = self.dir / JOURNAL
        if not path.exists():
            return
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            try:
                rec = json.loads(line)
            except ValueError:
                if i == len(lines) - 1:
                    break  # a torn last line (killed mid-write): it announced a step never taken
                raise errors.FailedPrecondition(f"journal {path} line {i + 1} is damaged") from None
            self._apply(rec)
            decided = list(rec.get("m", ())) + ([(rec["k"], rec["c"], rec.get("p", ""))] if "c" in rec else [])
            if decided:
                self.last_decided = [(self._by_key[k].start_ts, int(c), str(p)) for k, c, p in decided]
        # Start-up: every start_ts with no commit_ts belonged to a process that died
        # before deciding it; no Pump can serve it, so it is rolled back now.
        orphans = [d for d in self._by_start.values() if not d.commit_ts and d.start_ts not in self._rolled_back]
        decided = [d for d in self._by_key.values() if d.commit_ts]
        if len(decided) > KEEP_DECIDED or orphans:
            by_start = sorted(decided, key=lambda d: d.start_ts)
            keep = by_start[-KEEP_DECIDED:]
            rolled_back = sorted(self._rolled_back | {d.start_ts for d in orphans})
            dropped = [d.start_ts for d in by_start[:-KEEP_DECIDED]] + rolled_back[:-KEEP_DECIDED]
            self._forgotten_upto = max([self._forgotten_upto, *dropped])
            keys = {id(d): k for k, d in self._by_key.items()}
            tmp = path.with_suffix(".tmp")
            with tmp.open("w", encoding="utf-8") as f:
                if self._forgotten_upto:
                    f.write(json.dumps({"f": self._forgotten_upto}) + "\n")
                for d in keep:
                    f.write(json.dumps(self._start_rec(keys[id(d)], d)) + "\n")
                    f.write(json.dumps({"k": keys[id(d)], "c": d.commit_ts, "p": d.pump}) + "\n")
                for s in rolled_back[-KEEP_DECIDED:]:
                    f.write(json.dumps({"s": s, "r": 1}) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            self._rolled_back |= {d.start_ts for d in orphans}
            self.orphaned = sorted(d.start_ts for d in orphans)
            for d in orphans:
                self._by_key = {k: v for k, v in self._by_key.items() if v is not d}

    @staticmethod
    def _start_rec(key: str, d: Decision) -> dict[str, Any]:
        rec: dict[str, Any] = {"k": key, "s": d.start_ts}
        if d.ddl is not None:
            rec["ddl"] = [base64.b64encode(t.SerializeToString()).decode() for t in d.ddl]
        return rec

    def _apply(self, rec: dict[str, Any]) -> None:
        if "f" in rec:
            self._forgotten_upto = max(self._forgotten_upto, int(rec["f"]))
            return
        if "m" in rec or "b" in rec:
            for key, commit_ts, pump in rec.get("m", ()):
                self._apply({"k": key, "c": commit_ts, "p": pump})
            for key, start_ts in rec.get("b", ()):
                self._apply({"k": key, "s": start_ts})
            return
        if rec.get("r"):
            self._rolled_back.add(int(rec["s"]))
            return
        key = rec["k"]
        if "s" in rec:
            d = Decision(int(rec["s"]))
            if "ddl" in rec:
                d.ddl = [binlog_pb2.TableInfo.FromString(base64.b64decode(x)) for x in rec["ddl"]]
            self._begun(key, d)
        elif "c" in rec:
            d = self._by_key[key]
            d.commit_ts = int(rec["c"])
            d.pump = str(rec.get("p", ""))

    def _append(self, rec: dict[str, Any]) -> None:
        self._journal.write(json.dumps(rec) + "\n")
        self._journal.flush()
        os.fsync(self._journal.fileno())

    def decision(self, key: str) -> Decision | None:
        """The decided (``commit_ts`` set) transaction KEY, if any."""
        with self._lock:
            d = self._by_key.get(key)
            return d if d is not None and d.commit_ts else None

    def begin(self, key: str, start_ts: int, ddl: list[binlog_pb2.TableInfo] | None = None) -> Decision:
        with self._lock:
            d = Decision(start_ts)
            d.ddl = ddl
            self._append(self._start_rec(key, d))
            self._begun(key, d)
            return d

    def _begun(self, key: str, d: Decision) -> None:
        """Record KEY's new attempt ``d`` (its line is written); an undecided earlier
        attempt of the same KEY is rolled back (a re-read transaction gets a new start_ts)."""
        old = self._by_key.get(key)
        if old is not None and not old.commit_ts:
            self._rolled_back.add(old.start_ts)
        self._by_key[key] = d
        self._by_start[d.start_ts] = d

    def begin_many(self, items: list[tuple[str, int]]) -> None:
        """Journal the start_ts of every (key, start_ts) in one fsync'ed line (a group's begins)."""
        self.step([], items)

    def step(self, decisions: list[tuple[str, int, str]], begins: list[tuple[str, int]]) -> None:
        """One fsync'ed line that decides every (key, commit_ts, pump) of ``decisions`` and
        begins every (key, start_ts) of ``begins``: a crash leaves all of it or none."""
        with self._lock:
            for key, _c, _p in decisions:
                if key not in self._by_key:
                    raise ValueError(f"transaction {key!r} was never begun")
            rec: dict[str, Any] = {}
            if decisions:
                rec["m"] = [[k, c, p] for k, c, p in decisions]
            if begins:
                rec["b"] = [[k, s] for k, s in begins]
            if not rec:
                return
            self._append(rec)
            for key, commit_ts, pump in decisions:
                d = self._by_key[key]
                d.commit_ts, d.pump = commit_ts, pump
            for key, start_ts in begins:
                self._begun(key, Decision(start_ts))
            self._trim()

    def decide(self, key: str, commit_ts: int, pump: str) -> None:
        with self._lock:
            self._append({"k": key, "c": commit_ts, "p": pump})
            d = self._by_key[key]
            d.commit_ts = commit_ts
            d.pump = pump
            self._trim()

    def _trim(self) -> None:
        if len(self._by_key) > 2 * KEEP_DECIDED:
            # Bounded memory for a long run: the oldest half is far behind any
            # checkpoint (taken every second); its lines stay in the file until
            # the next start's compaction, which keeps the newest KEEP_DECIDED.
            for old in list(self._by_key)[:KEEP_DECIDED]:
                gone = self._by_key.pop(old)
                self._by_start.pop(gone.start_ts, None)
                self._forgotten_upto = max(self._forgotten_upto, gone.start_ts)

    def decide_many(self, decisions: list[tuple[str, int, str]]) -> None:
        """Decide every (key, commit_ts, pump) in one fsync'ed journal line (all or none)."""
        self.step(decisions, [])

    def abandon(self, start_ts: int) -> None:
        with self._lock:
            self._append({"s": start_ts, "r": 1})
            self._rolled_back.add(start_ts)

    # -- TxnStatus
    def txn_status(self, start_ts: int) -> tuple[str, int]:
        with self._lock:
            if start_ts in self._rolled_back:
                return txn_status.ROLLED_BACK, 0
            d = self._by_start.get(start_ts)
            if d is None:
                if start_ts <= self._forgotten_upto:
                    # Its decision was dropped: it may have committed, so it is not
                    # answered rolled back (see *TxnStatus* in the module docstring).
                    return txn_status.RUNNING, 0
                # Never minted by this source.
                return txn_status.ROLLED_BACK, 0
            if d.commit_ts:
                return txn_status.COMMITTED, d.commit_ts
            return txn_status.RUNNING, 0

    def close(self) -> None:
        self._journal.close()
        self._lockfile.close()  # releases the flock
