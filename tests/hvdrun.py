"""``horovodrun`` for the test fixtures (tests/conftest.py): Horovod's own launcher
(``horovod.runner.launch.run_commandline``, what the ``horovodrun`` entry point runs), with the
same arguments, less one thing: its check that Horovod was built with Gloo. That check forks a
process that imports ``horovod.torch`` (so torch) at every launch, 2-5 s on 2 cores before any
rank starts; the fixtures make it once per session (:func:`conftest.gloo_built_once`, the same
``horovod.common.util.gloo_built``) and fail with Horovod's message when it says no."""

import sys

from horovod.runner import launch

if __name__ == "__main__":
    launch.gloo_built = lambda verbose=False: True   # checked once by the fixtures
    sys.argv[0] = "horovodrun"
    sys.exit(launch.run_commandline())
