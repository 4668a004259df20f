"""Run ``pgc-hvd train`` on every rank (the CLI's main, with this script's arguments)."""
import sys

from pgc_hvd.apps.train import main

sys.exit(main(sys.argv[1:]))
