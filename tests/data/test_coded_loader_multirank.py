"""torchvision ImageFolder + CodedLoader(num_workers=2) under horovodrun, one rank slowed:
every shard is trained under pgc-cr, bcgc and bounded-staleness, and the ranks end with the
same parameters; at np 2, a loader whose transforms differ across ranks is refused
(coded_loader_checks.py)."""

import re
from pathlib import Path

import pytest

from image_folder import write_image_folder

SCRIPT = Path(__file__).with_name("coded_loader_checks.py")


@pytest.mark.multirank
@pytest.mark.parametrize("scheme,np_", [("pgc-cr", 3), ("bcgc", 3), ("bounded-staleness", 3),
                                        ("pgc-cr", 2)])
def test_every_shard_trains_through_the_workers(horovodrun, tmp_path, scheme, np_):
    folder = write_image_folder(tmp_path / "images", classes=np_, per_class=16, size=8, seed=1)
    extra = ["mismatch"] if np_ == 2 else []   # and: transforms that differ are refused
    proc = horovodrun(np_, SCRIPT, scheme, str(folder), "30", *extra, timeout=150)
    assert len(re.findall(rf"CHECK {scheme} ok rank=\d", proc.stdout)) == np_, proc.stdout
    assert len(re.findall(r"CHECK mismatch ok rank=\d", proc.stdout)) == len(extra) * np_
    print("\n".join(line for line in proc.stdout.splitlines() if "SHARDS" in line))
