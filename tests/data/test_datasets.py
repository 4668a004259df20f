import pickle

import numpy as np
import pytest

from pgc_hvd.data import (ImageFolder, load_cifar10, load_dataset, make_generated, standardize,
                          train_test_split)


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


def _write_cifar(root, rng):
    d = root / "cifar-10-batches-py"
    d.mkdir()
    data = {}
    for name, m in [("data_batch_1", 6), ("data_batch_2", 4), ("test_batch", 5)]:
        x = rng.integers(0, 256, size=(m, 3072), dtype=np.uint8)
        y = rng.integers(0, 10, size=m).tolist()
        with open(d / name, "wb") as f:
            pickle.dump({b"data": x, b"labels": y, b"batch_label": name.encode()}, f)
        data[name] = (x, y)
    with open(d / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)]}, f)
    return data


def test_cifar10_loader_on_tiny_files(tmp_path):
    data = _write_cifar(tmp_path, np.random.default_rng(0))
    tr = load_cifar10(tmp_path, train=True)
    assert tr.X.shape == (10, 3, 32, 32) and tr.num_classes == 10
    x1, y1 = data["data_batch_1"]
    assert np.allclose(tr.X[0], x1[0].reshape(3, 32, 32) / 255.0)
    assert tr.y[:6].tolist() == y1
    assert tr.classes[3] == "c3"
    te = load_dataset("cifar10", root=tmp_path / "cifar-10-batches-py", train=False)
    assert len(te) == 5 and te.y.tolist() == data["test_batch"][1]
    assert len(load_cifar10(tmp_path, limit=7)) == 7
    with pytest.raises(FileNotFoundError):
        load_cifar10(tmp_path / "nowhere")
    for bad in (0, -1):
        with pytest.raises(ValueError, match="limit must be an int >= 1"):
            load_cifar10(tmp_path, limit=bad)


@pytest.mark.parametrize("content, message", [
    (b"not a pickle", "is not a CIFAR-10 python batch"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 12]}, "labels outside 0..9"),
    ({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0]}, "1 labels for 2 images"),
    ({b"data": np.zeros((2, 4000), np.uint8), b"labels": [0, 1]}, "not \\(N, 3072\\)"),
    ({b"data": np.zeros((2, 3072), np.uint8)}, "no 'data' or 'labels'"),
])
def test_cifar10_loader_names_a_damaged_file(tmp_path, content, message):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    path = d / "data_batch_1"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        with open(path, "wb") as f:
            pickle.dump(content, f)
    with pytest.raises(ValueError, match=message) as err:
        load_cifar10(tmp_path)
    assert "data_batch_1" in str(err.value)


def test_image_folder_on_tiny_files(tmp_path):
    from PIL import Image
    rng = np.random.default_rng(0)
    for cls, count in [("cat", 3), ("dog", 2)]:
        (tmp_path / cls).mkdir()
        for i in range(count):
            arr = rng.integers(0, 256, size=(10, 12, 3), dtype=np.uint8)
            Image.fromarray(arr).save(tmp_path / cls / f"{i}.png")
    (tmp_path / "cat" / "notes.txt").write_text("not an image")
    lazy = ImageFolder(tmp_path, size=8)
    assert len(lazy) == 5 and lazy.classes == ["cat", "dog"] and lazy.targets.tolist() == [0, 0, 0, 1, 1]
    x, label = lazy[4]
    assert x.shape == (3, 8, 8) and label == 1 and 0 <= x.min() and x.max() <= 1
    ds = load_dataset("imagefolder", root=tmp_path, size=8, limit_per_class=2)
    assert ds.X.shape == (4, 3, 8, 8) and ds.num_classes == 2
    with pytest.raises(ValueError):
        load_dataset("imagefolder")
    empty = tmp_path / "empty"
    (empty / "cat").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="no images"):
        ImageFolder(empty)
