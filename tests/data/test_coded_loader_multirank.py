"""torchvision ImageFolder + CodedLoader(num_workers=2) under horovodrun, one rank slowed:
every shard is trained under pgc-cr, bcgc and bounded-staleness, and the ranks end with the
same parameters; at np 2, a loader whose transforms differ across ranks is refused
(coded_loader_checks.py). The runs are entries of the session's np 3 and np 2 launches
(``launch_group``)."""

from pathlib import Path

import pytest
from checks import passed

from image_folder import write_image_folder

SCRIPT = Path(__file__).with_name("coded_loader_checks.py")


def _images(scheme, np_):
    def args(cwd):
        folder = write_image_folder(cwd / "images", classes=np_, per_class=16, size=8, seed=1)
        extra = ["mismatch"] if np_ == 2 else []   # and: transforms that differ are refused
        return [scheme, folder, "30", *extra]
    return args


PARAMS = [("pgc-cr", 3), ("bcgc", 3), ("bounded-staleness", 3), ("pgc-cr", 2)]
TEST = "test_every_shard_trains_through_the_workers"
LAUNCH_GROUPS = [("horovodrun", np_, [(f"{scheme}-{n}", TEST, SCRIPT, _images(scheme, n))
                                      for scheme, n in PARAMS if n == np_]) for np_ in (3, 2)]


@pytest.mark.multirank
@pytest.mark.parametrize("scheme,np_", PARAMS)
def test_every_shard_trains_through_the_workers(launch_group, request, scheme, np_):
    extra = ["mismatch"] if np_ == 2 else []
    proc = launch_group(request, "horovodrun", np_).ran(f"{scheme}-{np_}")
    checks = passed(proc.stdout)
    assert len(checks.get(scheme, [])) == np_, proc.stdout
    assert len(checks.get("mismatch", [])) == len(extra) * np_, proc.stdout
    print("\n".join(line for line in proc.stdout.splitlines() if "SHARDS" in line))
