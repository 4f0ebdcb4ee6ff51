"""`make demo` act 4: the ``binlake_apply`` DAG applies act 3's lake to a SQLite
target, then ``binlake diff`` compares the target with act 2's upstream.

Called by ``scripts/demo.py`` (``act4``); the DAG run happens in a child process
(``--dag-run``), as act 3's do, because Airflow reads its configuration from the
environment when first imported.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time
from typing import Any

DAGS = pathlib.Path(__file__).resolve().parents[1] / "dags"


def say(msg: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def act4(root: pathlib.Path, env: dict[str, str], upstream: str) -> int:
    print()
    target = f"sqlite:///{root}/apply-replica.db"
    tasks = root / "tasks"
    tasks.mkdir(exist_ok=True)
    task_file = tasks / "replica.toml"
    task_file.write_text(f'name = "replica"\nlake = "{env["BINLAKE_LAKE_DIR"]}"\ntarget = "{target}"\n'
                         f'mode = "consistent"\ndiff_source = "{upstream}"\n')
    env = {**env, "BINLAKE_APPLY_TASKS": str(tasks)}
    say(f"act 4: the binlake_apply DAG applies the lake to {target} (task file {task_file})")
    log = root / "airflow" / "apply-run.log"
    with log.open("w") as out:
        child = subprocess.run([sys.executable, __file__, "--dag-run"], env=env, stdout=out,
                               stderr=subprocess.STDOUT, timeout=1800)
    lines = [ln for ln in log.read_text().splitlines() if ln.startswith("{\"act4\"")]
    if child.returncode != 0 or not lines:
        print("\n".join(log.read_text().splitlines()[-40:]))
        say(f"FAILED: the apply DAG run (exit {child.returncode}); see {log}")
        return 1
    result = json.loads(lines[-1])["act4"]
    say(f"DAG run {result['state']}: tasks {result['tasks']}")
    for s in result["applied"]:
        print(f"  task {s['task']}: {s['windows']} windows, {s['changes']} row changes "
              f"({', '.join(f'{n} {op}' for op, n in s['changes_by_op'].items())}), {s['ddls']} DDLs, "
              f"{s['rows_written']} rows written in {s['elapsed_s']:.1f}s; checkpoint {s['checkpoint_ts']}")
    say(f"binlake diff {upstream} {target}")
    diff = subprocess.run([sys.executable, "-m", "binlake.cli", "diff", upstream, target], env=env,
                          capture_output=True, text=True, timeout=600)
    print(diff.stdout.rstrip())
    ok = result["state"] == "success" and diff.returncode == 0
    print()
    print("VERDICT (act 4):", "PASS - the apply DAG made the SQLite target equal to the upstream; every table OK"
          if ok else "FAIL")
    return 0 if ok else 1


def dag_run() -> int:
    """The child: one ``dag.test`` of binlake_apply; prints one JSON line."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    bag = DagBag(dag_folder=str(DAGS))
    if bag.import_errors:
        print(json.dumps({"error": str(bag.import_errors)}))
        return 1
    dr = bag.dags["binlake_apply"].test()
    with create_session() as session:
        tis = session.scalars(select(TaskInstance).where(TaskInstance.dag_id == "binlake_apply",
                                                         TaskInstance.run_id == dr.run_id)).all()
        states = {f"{ti.task_id}[{ti.map_index}]" if ti.map_index >= 0 else ti.task_id: str(ti.state) for ti in tis}
        xcoms = session.scalars(select(XComModel).where(XComModel.dag_id == "binlake_apply",
                                                        XComModel.run_id == dr.run_id,
                                                        XComModel.task_id == "apply",
                                                        XComModel.key == "return_value")).all()
        applied: list[Any] = [json.loads(x.value) if isinstance(x.value, str) else x.value for x in xcoms]
    print(json.dumps({"act4": {"state": str(dr.state), "tasks": states, "applied": applied}}), flush=True)
    return 0 if str(dr.state) == "success" else 1


if __name__ == "__main__":
    sys.exit(dag_run() if sys.argv[1:] == ["--dag-run"] else 2)
