#!/bin/sh
# Host discovery for elastic runs (horovodrun --host-discovery-script): print the hosts that may
# run ranks now, one "HOST:SLOTS" a line. Horovod runs it every second; a host that disappears
# from the output is removed, a new one is added (up to --max-np). Here: a file you edit
# (default launch/elastic_hosts.txt, or $PGC_HVD_HOSTS_FILE); with a scheduler, ask it instead.
cat "${PGC_HVD_HOSTS_FILE:-$(dirname "$0")/elastic_hosts.txt}"
