from rlrobot.catalogue import CATALOGUE_PATH, build_catalogue, render


def test_the_shipped_catalogue_is_what_the_registries_hold_today():
    assert CATALOGUE_PATH.read_text() == render(build_catalogue()), (
        "rlrobot/catalogue.json is stale (a task or algorithm was added or changed): run python -m rlrobot.catalogue")


def test_list_tasks_and_list_algos_read_the_catalogue_without_importing_torch_or_mujoco():
    import subprocess
    import sys

    code = ("import sys; from rlrobot.commands.listing import ListTasksArgs, list_algorithms, list_tasks; "
            "list_tasks(ListTasksArgs()); list_algorithms(); "
            "print('HEAVY', sorted(m for m in ('torch', 'mujoco') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "so101-lift" in out and "flow-noise" in out
    assert out.strip().splitlines()[-1] == "HEAVY []"
