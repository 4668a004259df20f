"""CodedLoader on torchvision's ImageFolder of tiny JPEGs: the batch of (partition, step), replica
identity under random augmentation, prediction and jumps, epochs, workers and pinning, errors."""

import random
import warnings

import numpy as np
import pytest
import torch
from torchvision import datasets, transforms

from pgc_hvd.data import CodedLoader, partition
from pgc_hvd.runtime.consistency import fingerprint_differences, loader_fingerprint
from pgc_hvd.schemes.registry import get_scheme

torch.set_num_threads(1)

AUGMENT = transforms.Compose([transforms.RandomCrop(8, padding=2),
                              transforms.RandomHorizontalFlip(), transforms.ToTensor()])


def folder_dataset(root, transform=AUGMENT):
    return datasets.ImageFolder(str(root), transform=transform)


class Counting(torch.utils.data.Dataset):
    """A synthetic dataset that counts its reads (sample i is a vector of i's)."""

    def __init__(self, size, classes=3):
        self.size, self.reads = size, 0
        self.targets = [i % classes for i in range(size)]

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        self.reads += 1
        return torch.full((2,), float(i)) + torch.rand(2), self.targets[i]


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        yield from range(10)


def keys_of(scheme, rank, steps):
    return [(p, t) for t in steps for p, _ in scheme.work_plan(rank, t).evaluate]


def test_batch_is_the_seeded_slice_of_its_partition(image_folder):
    ds = folder_dataset(image_folder(classes=3, per_class=10))
    ld = CodedLoader(ds, n=3, batch_size=4, iid=False, seed=5)
    assert [len(p) for p in ld.partitions] == [10, 10, 10] and len(ld) == 2
    parts = partition(np.asarray(ds.targets), 3, iid=False, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(parts, ld.partitions))
    assert [set(np.asarray(ds.targets)[p]) for p in ld.partitions] == [{0}, {1}, {2}]
    for k in range(3):
        for epoch in range(3):
            perm = np.random.default_rng((5, k, epoch)).permutation(10)
            batches = [ld.indices(k, epoch * 2 + j) for j in range(2)]
            assert np.array_equal(np.concatenate(batches), parts[k][perm[:8]])
            assert len(set(np.concatenate(batches).tolist())) == 8   # no repeat in an epoch
        assert ld.epoch_of(5) == 2
    x, y = ld.batch(2, 3)
    assert x.shape == (4, 3, 8, 8) and x.dtype == torch.float32 and y.tolist() == [2] * 4


def test_replicas_get_bit_identical_augmented_batches(image_folder):
    """Two ranks computing the same (partition, step) -- one through 2 worker processes, one in
    its own process -- get the same bits, though RandomCrop and RandomHorizontalFlip draw
    random numbers; the same sample at another step is augmented afresh."""
    root = image_folder(classes=3, per_class=8)
    scheme = get_scheme("pgc-cr", n=3, s=1)
    a = CodedLoader(folder_dataset(root), n=3, batch_size=4, seed=1, num_workers=2)
    b = CodedLoader(folder_dataset(root), n=3, batch_size=4, seed=1)
    a.bind(scheme, 0)
    b.bind(scheme, 2)                      # rank 2 replicates partition 0 with rank 0
    shared = [(p, t) for p, t in keys_of(scheme, 0, range(6)) if p == 0]
    for p, t in shared:
        xa, ya = a.batch(p, t)
        xb, yb = b.batch(p, t)
        assert torch.equal(xa, xb) and torch.equal(ya, yb), (p, t)
    assert a.stats["prefetched"] >= 1   # some of them came from the workers
    a.close()
    plain = CodedLoader(folder_dataset(root, transforms.ToTensor()), n=3, batch_size=4, seed=1)
    ld = CodedLoader(folder_dataset(root), n=3, batch_size=4, seed=1)
    # steps 0 and 2 of one epoch hold other samples; steps 0 and 2 * len of the same
    # partition at different epochs hold the same 4 samples in another order: compare per sample
    differs = 0
    for step in range(0, 12, len(ld)):
        x, _ = ld.batch(0, step)
        ref, _ = plain.batch(0, step)
        differs += sum(not torch.equal(x[i], ref[i]) for i in range(4))
    assert differs >= 4, "the augmentation never changed a sample"


def test_sample_randomness_does_not_disturb_the_callers_generators():
    ld = CodedLoader(Counting(30), n=3, batch_size=5)
    torch.manual_seed(123)
    random.seed(7)
    np.random.seed(9)
    expect = (torch.rand(3), random.random(), np.random.rand())
    torch.manual_seed(123)
    random.seed(7)
    np.random.seed(9)
    ld.batch(0, 0)
    assert (torch.equal(torch.rand(3), expect[0]) and random.random() == expect[1]
            and np.random.rand() == expect[2])


@pytest.mark.parametrize("scheme_name", ["pgc-cr", "bcgc", "bounded-staleness"])
def test_prediction_survives_jumps_and_steps_back(scheme_name):
    """A rank's steps as a straggler sees them: consecutive, a jump inside the prefetch window,
    a jump past it, a step back (a new run on the same loader), an extra key of its step (a
    re-evaluated slot). Every batch equals the one computed on demand; straight runs are
    served by the workers."""
    scheme = get_scheme(scheme_name, n=3, s=1)
    ds = Counting(60)
    ld = CodedLoader(ds, n=3, batch_size=4, num_workers=2, prefetch_factor=2)
    ref = CodedLoader(ds, n=3, batch_size=4)
    ld.bind(scheme, 1)
    steps = [0, 1, 2, 3, 4, 5, 7, 8, 20, 21, 22, 23, 2, 3, 4, 5, 6]
    seq = keys_of(scheme, 1, steps)
    seq.insert(len(keys_of(scheme, 1, steps[:4])), (1, 3))    # an extra key at step 3
    for p, t in seq:
        x, y = ld.batch(p, t)
        rx, ry = ref.batch(p, t)
        assert torch.equal(x, rx) and torch.equal(y, ry), (p, t)
    s = ld.stats
    assert s["prefetched"] + s["here"] == len(seq)
    assert s["prefetched"] >= len(seq) - 8, s   # misses: first, extra, jump past, step back
    ld.close()
    assert ld.batch(*seq[0]) is not None   # starts again after close
    ld.close()


def test_a_straight_run_is_prefetched_and_memory_stays_bounded():
    scheme = get_scheme("pgc-cr", n=3, s=1)
    ld = CodedLoader(Counting(300), n=3, batch_size=10, num_workers=2)
    ld.bind(scheme, 0)
    seq = keys_of(scheme, 0, range(60))    # 6 epochs of 10 steps
    for p, t in seq:
        ld.batch(p, t)
    assert ld.stats == {"prefetched": len(seq) - 1, "discarded": 0, "here": 1}
    assert ld.rule.cached_permutations <= 16 and len(ld._plans) <= 64
    assert len(ld._pending) <= 2 * 2    # num_workers x prefetch_factor in flight
    ld.close()


def test_no_sample_is_read_before_its_batch():
    """A million-sample dataset: building the loader reads no sample, a batch reads its own."""
    ds = Counting(10 ** 6)
    ld = CodedLoader(ds, n=4, batch_size=8, iid=False)
    assert ds.reads == 0 and len(ld) == 31250
    ld.batch(3, 10 ** 5)
    assert ds.reads == 8


def test_pin_memory_and_device_are_accepted_on_cpu():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # torch warns that no accelerator is there to pin for
        ld = CodedLoader(Counting(40), n=2, batch_size=5, num_workers=2, pin_memory=True,
                         device="cpu")
        ld.bind(get_scheme("bounded-staleness", n=2, s=1), 0)
        for t in range(4):
            x, y = ld.batch(t % 2, t)
            assert x.device.type == "cpu" and x.shape == (5, 2)
        ld.close()


def test_from_dataloader_keeps_its_settings_and_replaces_its_sampler():
    def collate(samples):
        return torch.stack([x for x, _ in samples]) * 0 + 7, [y for _, y in samples]
    dl = torch.utils.data.DataLoader(Counting(40), batch_size=5, shuffle=True, num_workers=2,
                                     prefetch_factor=3, collate_fn=collate)
    ld = CodedLoader.from_dataloader(dl, n=2, seed=4)
    assert (ld.batch_size, ld.num_workers, ld.seed) == (5, 2, 4)
    assert ld.dataloader.prefetch_factor == 3
    x, y = ld.batch(1, 0)
    assert torch.all(x == 7) and isinstance(y, list) and len(y) == 5
    ld.close()
    bare = torch.utils.data.DataLoader(Counting(40), batch_sampler=[[0, 1]])
    with pytest.raises(ValueError, match="pass batch_size=B"):
        CodedLoader.from_dataloader(bare, n=2)
    assert CodedLoader.from_dataloader(bare, n=2, batch_size=4).batch_size == 4


def test_set_epoch_and_len():
    ld = CodedLoader(Counting(31), n=3, batch_size=3, sizes=[1, 1, 1])
    assert len(ld) == 3                       # partitions of 11, 10, 10 samples
    ld.set_epoch(4)
    assert ld.epoch == 4
    assert np.array_equal(ld.indices(0, 12), ld.indices(0, 12))   # step 12 = epoch 4
    with pytest.raises(ValueError, match="epoch must be an int >= 0"):
        ld.set_epoch(-1)


def test_bad_input_names_the_problem_and_the_fix():
    with pytest.raises(TypeError, match="map-style dataset"):
        CodedLoader(Stream(), n=2, batch_size=2)
    with pytest.raises(ValueError, match="fewer than batch_size=8: use batch_size <= 5"):
        CodedLoader(Counting(10), n=2, batch_size=8)
    with pytest.raises(ValueError, match="no .targets; pass labels="):
        CodedLoader(torch.utils.data.TensorDataset(torch.zeros(10, 2)), n=2, batch_size=2,
                    iid=False)
    with pytest.raises(ValueError, match="outside \\[0, 9\\]"):
        CodedLoader(Counting(10), n=2, batch_size=2, partitions=[[0, 1], [2, 10]])
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        CodedLoader(Counting(10), n=0, batch_size=2)
    with pytest.raises(ValueError, match="prefetch_factor"):   # torch's own check
        CodedLoader(Counting(10), n=2, batch_size=2, prefetch_factor=2)
    ld = CodedLoader(Counting(10), n=2, batch_size=2)
    with pytest.raises(ValueError, match="build it with n=hvd.size"):
        ld.bind(get_scheme("pgc-cr", n=3, s=1), 0)
    with pytest.raises(IndexError, match="partition 2 is not in"):
        ld.batch(2, 0)
    with pytest.raises(TypeError, match="optimizer.batches"):
        iter(ld)


def test_fingerprint_names_the_setting_and_reads_no_sample(image_folder):
    root = image_folder(classes=2, per_class=6)
    counting = Counting(40)
    base = loader_fingerprint(CodedLoader(counting, n=2, batch_size=4, seed=1))
    assert counting.reads == 0
    assert base == loader_fingerprint(CodedLoader(Counting(40), n=2, batch_size=4, seed=1))
    others = {"loader seed": CodedLoader(Counting(40), n=2, batch_size=4, seed=2),
              "loader batch_size": CodedLoader(Counting(40), n=2, batch_size=5, seed=1),
              "loader dataset": CodedLoader(Counting(42), n=2, batch_size=4, seed=1)}
    for field, other in others.items():
        assert field in [f for f, _, _ in fingerprint_differences([base, loader_fingerprint(other)])]
    a = loader_fingerprint(CodedLoader(folder_dataset(root), n=2, batch_size=2))
    b = loader_fingerprint(CodedLoader(folder_dataset(root, transforms.ToTensor()), n=2,
                                       batch_size=2))
    assert a["loader dataset"].startswith("torchvision.datasets.folder.ImageFolder of 12")
    assert [f for f, _, _ in fingerprint_differences([a, b])] == ["loader transform"]
    sub = loader_fingerprint(CodedLoader(torch.utils.data.Subset(folder_dataset(root), range(8)),
                                         n=2, batch_size=2))
    assert sub["loader dataset"].startswith("torch.utils.data.dataset.Subset of 8 samples in "
                                            "torchvision.datasets.folder.ImageFolder of 12")
    assert sub["loader transform"] == a["loader transform"]

    def fps(k):   # a function's repr holds its address, which differs between processes
        def to_tensor(im):
            return transforms.functional.to_tensor(im) * k
        return loader_fingerprint(CodedLoader(folder_dataset(root, to_tensor), n=2, batch_size=2))
    assert fps(1) == fps(2) and "0x?" in fps(1)["loader transform"]
