"""``x-launch migrate`` flags ``DistributedType.TPU`` (gone in Accelerate 1.x) with its fix."""

from __future__ import annotations

from pathlib import Path

SCRIPT = """\
import accelerate
from accelerate import Accelerator
from accelerate.utils import DistributedType, DistributedType as DT

accelerator = Accelerator()
if accelerator.distributed_type == DistributedType.TPU:
    pass
on_xla = accelerator.distributed_type in (DT.TPU, accelerate.utils.DistributedType.TPU)
tpu = accelerator.state.TPU  # some other TPU attribute: not ours to flag
"""


def test_each_use_is_flagged_with_the_fix_and_left_as_written(migrate_write, tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    err = migrate_write(path)
    assert err.splitlines() == [
        f"x-launch migrate: {path}:6: DistributedType.TPU is gone (Accelerate 1.x and x name it XLA): "
        "use DistributedType.XLA",
        f"x-launch migrate: {path}:8: DT.TPU is gone (Accelerate 1.x and x name it XLA): use DT.XLA",
        f"x-launch migrate: {path}:8: accelerate.utils.DistributedType.TPU is gone (Accelerate 1.x and x name it "
        "XLA): use accelerate.utils.DistributedType.XLA",
    ]
    # Only imports change: the comparison is the user's code, the note says what to write.
    assert path.read_text() == SCRIPT.replace("import accelerate\n", "import x_runtime as accelerate\n", 1).replace(
        "from accelerate import Accelerator\nfrom accelerate.utils import DistributedType, DistributedType as DT\n",
        "from x_runtime import Accelerator, DistributedType, DistributedType as DT\n",
    )
