"""The third-party client corpus: released packages that depend on webdataset, their data
loading run unchanged on the webdataset release each pins and on wdsx (tests/test_clients.py).

- packages.py: which packages, which webdataset each pins, and the cached download/install;
- shards.py: the small dataset they all read, built with tarfile;
- scenarios/: one program per client, which sets up and iterates its data loading;
- standins/: stand-ins for what cannot be installed here (torchvision), each saying why.
"""
