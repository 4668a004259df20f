import pickle

import numpy as np
import pytest

from pgc_hvd.data import load_cifar10, load_dataset, make_generated, standardize, train_test_split
from pgc_hvd.data.vision import cifar10, image_folder, to_tensor


@pytest.mark.parametrize("name,n,k,shape", [("digits", 1797, 10, (1, 8, 8)),
                                            ("breast_cancer", 569, 2, (30,)),
                                            ("wine", 178, 3, (13,)), ("iris", 150, 3, (4,))])
def test_sklearn_bundled(name, n, k, shape):
    ds = load_dataset(name)
    assert len(ds) == n and ds.num_classes == k and ds.feature_shape == shape
    assert ds.X.dtype == np.float32 and ds.y.dtype == np.int64
    assert set(np.unique(ds.y).tolist()) == set(range(k))


def test_generated_is_seeded():
    a, b = make_generated(200, 12, 4, seed=1), make_generated(200, 12, 4, seed=1)
    assert np.array_equal(a.X, b.X) and np.array_equal(a.y, b.y) and a.num_classes == 4


def test_standardize_and_split():
    ds = load_dataset("breast_cancer")
    tr, te = train_test_split(ds, 0.25, seed=0)
    assert len(tr) + len(te) == len(ds)
    assert abs(te.y.mean() - ds.y.mean()) < 0.05  # stratified
    trs, mu, sd = standardize(tr)
    assert np.allclose(trs.X.mean(0), 0, atol=1e-4) and np.allclose(trs.X.std(0), 1, atol=1e-3)
    tes, _, _ = standardize(te, mu, sd)
    assert tes.X.shape == te.X.shape


def _write_cifar(root, rng, per_batch=(6, 4, 3, 2, 1), test=5):
    """The layout of cifar-10-python.tar.gz with tiny random batches, str keys as the
    published (Python 2) pickles load; their MD5s differ from the published files, so
    torchvision reads them with verify=False only."""
    d = root / "cifar-10-batches-py"
    d.mkdir()
    data = {}
    names = [f"data_batch_{i + 1}" for i in range(5)] + ["test_batch"]
    for name, m in zip(names, list(per_batch) + [test]):
        x = rng.integers(0, 256, size=(m, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, size=m).tolist()
        with open(d / name, "wb") as f:
            pickle.dump({"data": x, "labels": y, "batch_label": name}, f)
        data[name] = (x, y)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({"label_names": [f"c{i}" for i in range(10)]}, f)
    return data


def test_cifar10_is_read_by_torchvision(tmp_path):
    from torchvision.datasets import CIFAR10

    data = _write_cifar(tmp_path, np.random.default_rng(0))
    tv = cifar10(tmp_path, verify=False)
    assert isinstance(tv, CIFAR10) and len(tv) == 16 and tv.classes[3] == "c3"
    tr = load_cifar10(tmp_path, train=True, verify=False)
    assert tr.X.shape == (16, 3, 32, 32) and tr.num_classes == 10
    x1, y1 = data["data_batch_1"]
    assert np.allclose(tr.X[0], x1[0].reshape(3, 32, 32) / 255.0)
    assert tr.y[:6].tolist() == y1
    assert tr.classes[3] == "c3"
    te = load_dataset("cifar10", root=tmp_path / "cifar-10-batches-py", train=False,
                      verify=False)     # the batches' folder itself is accepted too
    assert len(te) == 5 and te.y.tolist() == data["test_batch"][1]
    assert len(load_cifar10(tmp_path, limit=7, verify=False)) == 7
    with pytest.raises(ValueError, match="differ from the published files \\(MD5\\).*verify=False"):
        load_cifar10(tmp_path)
    with pytest.raises(FileNotFoundError, match="no CIFAR-10 python batches.*nothing is downloaded"):
        load_cifar10(tmp_path / "nowhere")
    for bad in (0, -1):
        with pytest.raises(ValueError, match="limit must be an int >= 1"):
            load_cifar10(tmp_path, limit=bad)


def test_cifar10_names_missing_and_damaged_files(tmp_path):
    _write_cifar(tmp_path, np.random.default_rng(0))
    d = tmp_path / "cifar-10-batches-py"
    (d / "data_batch_1").write_bytes(b"not a pickle")
    with pytest.raises(ValueError, match="does not hold readable CIFAR-10 python batches"):
        load_cifar10(tmp_path, verify=False)
    (d / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="missing data_batch_3"):
        load_cifar10(tmp_path, verify=False)


def test_image_folder_is_read_by_torchvision(tmp_path):
    from PIL import Image
    from torchvision.datasets import ImageFolder

    rng = np.random.default_rng(0)
    for cls, count in [("cat", 3), ("dog", 2)]:
        (tmp_path / cls).mkdir()
        for i in range(count):
            arr = rng.integers(0, 256, size=(10, 12, 3), dtype=np.uint8)
            Image.fromarray(arr).save(tmp_path / cls / f"{i}.png")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    lazy = image_folder(tmp_path, transform=to_tensor(8))
    assert isinstance(lazy, ImageFolder)
    assert len(lazy) == 5 and lazy.classes == ["cat", "dog"] and lazy.targets == [0, 0, 0, 1, 1]
    x, label = lazy[4]
    assert tuple(x.shape) == (3, 8, 8) and label == 1 and 0 <= x.min() and x.max() <= 1
    ds = load_dataset("imagefolder", root=tmp_path, size=8, limit_per_class=2)
    assert ds.X.shape == (4, 3, 8, 8) and ds.num_classes == 2 and ds.y.tolist() == [0, 0, 1, 1]
    assert np.allclose(ds.X[2], lazy[3][0].numpy())
    with pytest.raises(ValueError):
        load_dataset("imagefolder")
    with pytest.raises(FileNotFoundError, match="is not a folder"):
        image_folder(tmp_path / "nowhere")
    empty = tmp_path / "empty"
    (empty / "cat").mkdir(parents=True)
    with pytest.raises(FileNotFoundError):   # torchvision's own message
        image_folder(empty)


def test_mnist1d_is_generated_offline_and_cached(tmp_path, monkeypatch):
    pytest.importorskip("mnist1d")
    ds = load_dataset("mnist1d", root=tmp_path)
    assert (tmp_path / "mnist1d_seed42.npz").is_file()
    assert len(ds) == 5000 and ds.feature_shape == (1, 40) and ds.num_classes == 10
    assert set(np.unique(ds.y).tolist()) == set(range(10))
    # the cache is read back, not regenerated: the generator is not even importable now
    import builtins
    real = builtins.__import__

    def no_mnist1d(name, *a, **k):
        if name.startswith("mnist1d"):
            raise ImportError(name)
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_mnist1d)
    test = load_dataset("mnist1d", root=tmp_path, split="test")
    assert len(test) == 1000 and np.array_equal(test.X, ds.X[4000:])
    # without the package and without a cache: an error naming the fix
    with pytest.raises(ImportError, match="pip install mnist1d"):
        load_dataset("mnist1d", root=tmp_path / "empty")
