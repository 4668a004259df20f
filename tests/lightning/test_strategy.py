"""The Lightning door: a LightningModule trained unchanged by ``PGCStrategy`` at np 2 on the
CPU under torchrun (fit, validation, a checkpoint saved and resumed with ``strategy="pgc"``,
identical parameters; at s = 0 the same model as ``strategy="ddp"``; ``stragglers="auto"``
fit and resumed), and the strategy's refusals."""

from pathlib import Path

import pytest
from checks import passed_everywhere

HERE = Path(__file__).resolve().parent


@pytest.mark.multirank
def test_lightning_fit_validate_checkpoint_resume(torchrun, tmp_path):
    proc = torchrun(2, HERE / "lightning_checks.py", tmp_path / "ckpt", timeout=300)
    out = proc.stdout.splitlines()
    assert {"fit", "resume", "same_as_ddp", "auto"} <= passed_everywhere(proc.stdout, 2), \
        proc.stdout
    for tag in ("FIT", "RESUMED"):
        digests = {l.split("PARAMS ")[1] for l in out if f"{tag} version=" in l}
        assert len(digests) == 1, proc.stdout


def test_strategy_registered_and_refuses_comm_hooks():
    pytest.importorskip("lightning")
    from lightning.pytorch.strategies import StrategyRegistry

    import pgc_hvd.lightning as pl_door
    assert StrategyRegistry["pgc"]["strategy"] is pl_door.PGCStrategy
    s = pl_door.PGCStrategy(scheme="bcgc", stragglers=1, timeout=30, find_unused_parameters=True)
    assert s.pgc_options == {"scheme": "bcgc", "stragglers": 1, "timeout": 30}
    with pytest.raises(ValueError, match="communication hook"):
        pl_door.PGCStrategy(ddp_comm_hook=lambda state, bucket: None)
