"""The ``rlrobot`` commands, one table: each entry names what runs and how its arguments parse, as ``module:name``
strings imported only when that command runs (so ``rlrobot --help`` loads no torch). Adding a command is one entry
here and its module."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    help: str
    """one line for ``rlrobot --help``"""
    run: str
    """``module:function``: with ``args``, called with the parsed arguments; without, called with the raw argv"""
    args: str = ""
    """``module:Class``, the tyro dataclass of the command's arguments ('' = the function parses its own argv)"""
    description: str = ""
    """the command's ``--help`` description (default: ``help``)"""

    def __call__(self, name: str, argv: list[str]) -> Any:
        function = _load(self.run)
        if not self.args:
            return function(argv)
        import tyro

        return function(tyro.cli(_load(self.args), args=argv, prog=f"rlrobot {name}",
                                 description=self.description or self.help))


def _load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


COMMANDS: dict[str, Command] = {
    "train": Command("train a policy (rlrobot train --algo X --help: the options of algorithm X)",
                     "rlrobot.commands.train:main"),
    "eval": Command("evaluate a checkpoint or run directory in its task", "rlrobot.commands.eval:evaluate_checkpoint",
                    "rlrobot.commands.eval:EvalArgs"),
    "collect": Command("record scripted-expert demonstrations as a LeRobotDataset",
                       "rlrobot.commands.collect:collect_demonstrations", "rlrobot.commands.collect:CollectArgs"),
    "datasets": Command("the offline-RL dataset recipes and what each dataset holds", "rlrobot.commands.datasets:list_datasets",
                        "rlrobot.commands.datasets:DatasetsArgs"),
    "offline-bench": Command("offline RL table: tasks x recipes x algorithms x seeds at one gradient budget",
                             "rlrobot.commands.offline_bench:run_offline_bench",
                             "rlrobot.commands.offline_bench:OfflineBenchArgs",
                             "Offline RL benchmark: a Markdown table and learning curves."),
    "offline-check": Command("an offline RL run's regime (over- or underfitting) from its training metrics, and what to change",
                             "rlrobot.commands.offline_check:run_offline_check",
                             "rlrobot.commands.offline_check:OfflineCheckArgs",
                             "The offline-RL workflow's check (Kumar et al. 2021) of a run directory."),
    "list-tasks": Command("the tasks with their spaces and modes", "rlrobot.commands.listing:list_tasks",
                          "rlrobot.commands.listing:ListTasksArgs"),
    "list-algos": Command("the registered algorithms and the policy each trains", "rlrobot.commands.listing:list_algorithms",
                          "rlrobot.commands.listing:ListAlgosArgs"),
    "bench": Command("physics vs VecEnv vs training throughput, baselines measured in the same run",
                     "rlrobot.commands.bench:run_bench", "rlrobot.commands.bench:BenchArgs"),
    "serve": Command("serve a policy over an authenticated websocket", "rlrobot.real_robot.server:run_server",
                     "rlrobot.real_robot.server:ServeArgs",
                     "Serve a policy over a websocket (msgpack frames, HMAC-authenticated)."),
    "deploy": Command("run a policy on a robot (twin or LeRobot) through the safety supervisor",
                      "rlrobot.real_robot.deploy:run_deploy", "rlrobot.real_robot.deploy:DeployArgs"),
    "export": Command("a run's policy in another library's format (a VLA run as a LeRobot pretrained directory)",
                      "rlrobot.commands.export:run_export", "rlrobot.commands.export:ExportArgs"),
    "compare": Command("several runs' curves on one PNG (env steps and wall clock) with a table",
                       "rlrobot.commands.compare:run_compare", "rlrobot.commands.compare:CompareArgs",
                       "Several runs' evaluation curves on one PNG (env steps and wall clock)."),
    "results": Command("reproduce the published results from the registry (run, table, list)", "rlrobot.commands.results:main"),
    "prm-eval": Command("a process reward model on held-out episodes: progress curves (PNG), Spearman, done F1",
                        "rlrobot.commands.prm_eval:run_prm_eval", "rlrobot.commands.prm_eval:PRMEvalArgs"),
    "camera": Command("a camera's setup: photos of the arm, automatic alignment, overlay (rlrobot camera --help)",
                      "rlrobot.commands.camera:main"),
}
