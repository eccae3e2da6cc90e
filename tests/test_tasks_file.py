"""A user's own tasks from a file (``env.tasks``): JSON Lines, parquet, a saved ``datasets`` dataset, mapped by
config to an environment's task fields; bad input is an error naming the file and the row; a training run reads
them and a bad file stops it at start-up, before its run directory holds anything."""
import json
import os
import random

import pytest

from scope.config import EnvConfig
from scope.envs.base import get_env
from scope.envs.tasks import load_tasks
from helpers import tiny_run
from scope.guards import StartupError

MINE = [{"id": f"u{i}", "bio": f"You are person {i}, a nurse who likes dogs.", "group": "test" if i < 2 else "train"}
        for i in range(6)]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def env_with(path, **tasks):
    return EnvConfig(name="p4g", tasks={"path": path, "fields": {"user_id": "id", "persona": "bio"}, **tasks})


def test_own_p4g_personas_from_jsonl_split_by_seed_and_played_as_written(tmp_path):
    env = env_with(write_jsonl(tmp_path / "mine.jsonl", MINE), test_fraction=0.5, split_seed=3)
    train, test, every = (load_tasks(env, s) for s in ("train", "test", "all"))
    assert len(train) == len(test) == 3 and not {t.id for t in train} & {t.id for t in test}
    assert sorted(t.id for t in every) == sorted(f"p4g/u{i}" for i in range(6))
    assert [t.id for t in load_tasks(env, "test")] == [t.id for t in test]  # the same split every time
    other = env_with(env.tasks.path, test_fraction=0.5, split_seed=4)
    assert {t.id for t in load_tasks(other, "test")} != {t.id for t in test}  # the seed moves it
    played = get_env("p4g")(test[0], random.Random(0))
    prompt = played.views["partner"][0]["content"]
    assert test[0].data["persona"] in prompt and "Personality:" not in prompt  # the user's text, as written
    pitch = get_env("p4g_pitch")
    t = load_tasks(EnvConfig(name="p4g_pitch", tasks=env.tasks), "all")[0]
    assert t.id.startswith("p4g_pitch/")
    assert t.data["persona"] in pitch(t, random.Random(0)).views["partner"][0]["content"]


def test_a_split_column_and_a_path_per_split(tmp_path):
    path = write_jsonl(tmp_path / "mine.jsonl", MINE)
    env = env_with(path, split_column="group")
    assert [t.id for t in load_tasks(env, "test")] == ["p4g/u0", "p4g/u1"]
    with pytest.raises(ValueError, match="no row with group = 'dev' .have test, train."):
        load_tasks(env, "dev")
    a = write_jsonl(tmp_path / "a.jsonl", MINE[:4])
    b = write_jsonl(tmp_path / "b.jsonl", MINE[4:])
    two = env_with({"train": a, "test": b})
    assert [t.id for t in load_tasks(two, "test")] == ["p4g/u4", "p4g/u5"] and len(load_tasks(two, "all")) == 6
    with pytest.raises(ValueError, match="no file for split 'dev'"):
        load_tasks(two, "dev")


def test_parquet_and_saved_datasets(tmp_path):
    pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(MINE), str(tmp_path / "mine.parquet"))
    from_parquet = load_tasks(env_with(str(tmp_path / "mine.parquet"), split_column="group"), "train")
    assert [t.id for t in from_parquet] == ["p4g/u2", "p4g/u3", "p4g/u4", "p4g/u5"]

    one = datasets.Dataset.from_list(MINE)
    one.save_to_disk(str(tmp_path / "one"))
    assert [t.id for t in load_tasks(env_with(str(tmp_path / "one"), split_column="group"), "train")] == \
        [t.id for t in from_parquet]
    both = datasets.DatasetDict({"train": datasets.Dataset.from_list(MINE[:5]),
                                 "validation": datasets.Dataset.from_list(MINE[5:])})
    both.save_to_disk(str(tmp_path / "both"))
    env = env_with(str(tmp_path / "both"))
    assert [t.id for t in load_tasks(env, "validation")] == ["p4g/u5"] and len(load_tasks(env, "all")) == 6
    with pytest.raises(ValueError, match="no split 'test' .the dataset has train, validation."):
        load_tasks(env, "test")


TAU2_TASK = {"id": "mine-1", "description": {"purpose": "a user's own task"},
             "user_scenario": {"persona": None, "instructions": {
                 "domain": "retail", "reason_for_call": "You want to know where order #W0000001 is.",
                 "known_info": "You are Ada Lovelace in zip code 10001.", "unknown_info": "",
                 "task_instructions": "Be brief."}},
             "initial_state": None,
             "evaluation_criteria": {"actions": [{"action_id": "1_0", "name": "find_user_id_by_name_zip",
                                                  "arguments": {"first_name": "Ada", "last_name": "Lovelace",
                                                                "zip": "10001"}, "info": None}],
                                     "communicate_info": [], "nl_assertions": None}}


def test_tau2_tasks_in_upstream_format_from_jsonl_and_parquet(tmp_path):
    env = EnvConfig(name="tau2_retail", tasks={"path": write_jsonl(tmp_path / "t.jsonl", [TAU2_TASK])})
    (t,) = load_tasks(env, "all")
    assert t.id == "tau2_retail/mine-1" and t.data == {"task": TAU2_TASK}
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    # nested fields as JSON text: parquet's struct columns would merge the keys of all rows
    flat = {k: json.dumps(v) if isinstance(v, (dict, list)) else v for k, v in TAU2_TASK.items()}
    pq.write_table(pa.Table.from_pylist([flat]), str(tmp_path / "t.parquet"))
    (p,) = load_tasks(EnvConfig(name="tau2_retail", tasks={"path": str(tmp_path / "t.parquet")}), "all")
    assert p.data == t.data


def test_upstreams_own_tau2_tasks_written_as_a_user_would_read_back_as_the_built_in_ones(tmp_path):
    from conftest import shared_path

    root = shared_path("data", "tau2")
    upstream = json.load(open(os.path.join(root, "domains", "airline", "tasks.json")))
    mine = EnvConfig(name="tau2_airline", tasks={"path": write_jsonl(tmp_path / "air.jsonl", upstream)},
                     options={"data_dir": root})
    builtin = get_env("tau2_airline").load_tasks("all", data_dir=root)
    assert len(builtin) > 10
    assert [(x.id, x.data) for x in load_tasks(mine, "all")] == [(x.id, x.data) for x in builtin]


@pytest.mark.parametrize("rows,fields,error", [
    ([{"id": "a", "bio": "x"}, {"bio": "y"}], None,
     r"mine.jsonl line 2: no column 'id' \(env.tasks.fields: user_id: id\)"),
    ([{"id": "a", "bio": "x"}, {"id": "a", "bio": "y"}], None, r"line 2: task id 'p4g/a' again \(first at .*line 1\)"),
    ([{"id": "a", "bio": ""}], None, r"line 1: neither a persona text nor any persona field"),
    ([{"id": "a", "bio": "", "age": "old"}], None, r"line 1: age: a number, not 'old'"),
    ([{"user_id": "a", "persona": 3}], {}, r"line 1: persona: a text, not a int"),
    (["a persona"], None, r"line 1: a task is an object of fields, not a str"),
])
def test_a_bad_row_is_an_error_naming_the_file_and_the_row(tmp_path, rows, fields, error):
    env = EnvConfig(name="p4g", tasks={"path": write_jsonl(tmp_path / "mine.jsonl", rows),
                                       "fields": {"user_id": "id", "persona": "bio"} if fields is None else fields})
    with pytest.raises(ValueError, match=error):
        load_tasks(env, "all")


def test_bad_files_and_environments_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.jsonl not found"):
        load_tasks(env_with(str(tmp_path / "nothing.jsonl")), "all")
    (tmp_path / "bad.jsonl").write_text('{"id": "a", "bio": "x"}\n{"id": "b", bio}\n')
    with pytest.raises(ValueError, match="bad.jsonl line 2: not JSON"):
        load_tasks(env_with(str(tmp_path / "bad.jsonl")), "all")
    (tmp_path / "t.csv").write_text("id,bio\n")
    with pytest.raises(ValueError, match=r"t.csv: not a .jsonl, .json or .parquet file"):
        load_tasks(env_with(str(tmp_path / "t.csv")), "all")
    with pytest.raises(ValueError, match="'coop_coding' does not read its tasks from a file"):
        load_tasks(EnvConfig(name="coop_coding", tasks={"path": write_jsonl(tmp_path / "m.jsonl", MINE)}), "all")
    bad_tool = {**TAU2_TASK, "evaluation_criteria": {"actions": [{"name": "launch_rocket", "arguments": {}}]}}
    with pytest.raises(ValueError, match="line 1: evaluation_criteria.actions: 'launch_rocket' is not a retail tool"):
        load_tasks(EnvConfig(name="tau2_retail", tasks={"path": write_jsonl(tmp_path / "t.jsonl", [bad_tool])}), "all")
    with pytest.raises(ValueError, match="split 'dev': without env.tasks.split_column"):
        load_tasks(env_with(write_jsonl(tmp_path / "m2.jsonl", MINE)), "dev")


def run_cfg(run_dir, path, steps=1):
    return tiny_run(run_dir, steps, env={"tasks": {"path": path, "fields": {"user_id": "id", "persona": "bio"},
                                                   "split_column": "group"}})


def test_a_run_trains_on_a_users_tasks_and_a_bad_file_stops_it_at_start_up(tmp_path):
    from scope.train import train

    path = write_jsonl(tmp_path / "mine.jsonl", MINE)
    train(run_cfg(tmp_path / "run", path), log=lambda s: None)
    played = {json.loads(line)["task_id"] for line in open(tmp_path / "run" / "rollouts" / "step_000001.jsonl")}
    assert played and played <= {f"p4g/u{i}" for i in range(2, 6)}  # the train rows only
    bad = write_jsonl(tmp_path / "bad.jsonl", MINE[:3] + [{"id": "u9", "group": "train"}])
    with pytest.raises(StartupError, match="bad.jsonl line 4: no column 'bio'"):
        train(run_cfg(tmp_path / "run2", bad), log=lambda s: None)
    assert not os.path.exists(tmp_path / "run2" / "metrics.jsonl")
