"""The lab's commands: ``flywheel demo``, ``loop`` and ``simulate``.

``cli.main`` lists their names and imports this module only when one of them runs (or
help lists them), so the product never loads the lab on its own.
"""

from __future__ import annotations

import typer

from lab.commands.demo import demo as demo_command
from lab.commands.loop import loop as loop_command
from lab.commands.simulate import simulate as simulate_command

lab_app = typer.Typer()
lab_app.command("demo")(demo_command)
lab_app.command("loop")(loop_command)
lab_app.command("simulate")(simulate_command)
