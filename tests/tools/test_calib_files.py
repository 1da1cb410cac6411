"""mxamp quantize's calibration files as users write them, in a subprocess:
damaged files and odd members are one Error line; labels given as (N,),
(N, 1) or one-hot (N, C) give the same accuracy, anything else one line."""
import json
import os
import subprocess
import sys
import zipfile

import mxnet as mx
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMAND = [sys.executable, "-c", "import mxamp_cli; mxamp_cli.main()"]
ENV = {**os.environ, "PYTHONPATH": ROOT}
DATA = np.random.RandomState(0).rand(16, 3, 8, 8).astype("float32")


def quantize(directory, calib, *extra):
    return subprocess.run([*COMMAND, "quantize", "tiny", "--calib", calib, "--out", "o",
                           "--overwrite", *extra], cwd=directory, env=ENV,
                          capture_output=True, text=True, timeout=600)


def _truncated(path, source):
    data = open(source, "rb").read()
    open(path, "wb").write(data[:len(data) // 2])


def _with_text_member(path, source):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data.npy", open(source[:-len(".npz")] + ".npy", "rb").read())
        z.writestr("notes.txt", b"calibration set of 2026-11-25")


BAD_FILES = {
    "truncated.npz": (_truncated, "calibration data 'truncated.npz' is not a readable .npz "
                                  "file (truncated or corrupt?): File is not a zip file"),
    "truncated.npy": (_truncated, "calibration data 'truncated.npy' is not a readable .npy "
                                  "file (truncated or corrupt?): "),
    "text.npz": (_with_text_member, "calibration data 'text.npz': notes.txt is not a numeric "
                                    "array (save arrays with numpy.save / numpy.savez)"),
}


@pytest.mark.parametrize("name", list(BAD_FILES))
def test_a_damaged_file_is_one_error(tiny, name):
    directory = os.path.dirname(tiny)
    make, message = BAD_FILES[name]
    np.save(os.path.join(directory, "whole.npy"), DATA)
    np.savez(os.path.join(directory, "whole.npz"), data=DATA)
    make(os.path.join(directory, name),
         os.path.join(directory, "whole" + os.path.splitext(name)[1]))
    done = quantize(directory, name)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [done.stderr.strip()]  # one line, no traceback
    assert done.stderr.startswith("Error: " + message), done.stderr


@pytest.fixture(scope="module")
def predicted(tiny):
    """The float32 model's class for each example of DATA (4 classes)."""
    net = mx.gluon.SymbolBlock.imports(f"{tiny}-symbol.json", ["data"], f"{tiny}-0000.params")
    return net(mx.nd.array(DATA)).asnumpy().argmax(axis=1)


LABELS = {"(N,)": lambda p: p, "(N, 1)": lambda p: p.reshape(-1, 1),
          "(N, 1) float": lambda p: p.reshape(-1, 1).astype("float32"),
          "one-hot": lambda p: np.eye(4, dtype="float32")[p]}


@pytest.mark.parametrize("form", list(LABELS))
def test_labels_in_each_form_give_the_same_accuracy(tiny, predicted, form):
    """Labels equal to float32's predictions: float32's accuracy is exactly 1
    in every form ((N, 1) was broadcast to N x N, about 1/4; one-hot gave 0)."""
    directory = os.path.dirname(tiny)
    np.savez(os.path.join(directory, "labelled.npz"), data=DATA, label=LABELS[form](predicted))
    done = quantize(directory, "labelled.npz", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["accuracy"]["float32"] == 1.0


BAD_LABELS = {"fractions": np.full(16, 0.5), "negative": -np.ones(16, dtype="int64"),
              "two columns": np.ones((16, 2), dtype="int64"),
              "three dimensions": np.zeros((16, 1, 1), dtype="int64")}


@pytest.mark.parametrize("case", list(BAD_LABELS))
def test_other_labels_are_one_error(tiny, case):
    directory = os.path.dirname(tiny)
    labels = BAD_LABELS[case]
    np.savez(os.path.join(directory, "bad.npz"), data=DATA, label=labels)
    done = quantize(directory, "bad.npz")
    assert done.returncode == 1
    assert done.stderr == (f"Error: calibration data 'bad.npz': its 'label' array (shape "
                           f"{labels.shape}, {labels.dtype}) must hold one class index per "
                           "example, shaped (N,) or (N, 1), or one-hot rows (N, classes)\n")


# ---- every file a command reads: named in its one error line, no C++ text ----------------

# What MXNet's C++ messages carry, none of which may reach the user.
CPP_TEXT = ("Check failed", "std::", ".cc", "Stack trace", "MXNetError", "libpng", "Traceback")


def _image(directory, name):
    from PIL import Image
    Image.fromarray(np.random.RandomState(0).randint(0, 255, (12, 12, 3), dtype="uint8")).save(
        os.path.join(directory, name))


def _images_with(bad, make):
    """A folder of two good images and one bad one, `bad`, made by `make`."""
    def build(folder):
        os.makedirs(folder)
        for name in ("a.jpg", "b.png"):
            _image(folder, name)
        make(os.path.join(folder, bad))
        return os.path.join(folder, bad)
    return build


def _write(data):
    def make(path):
        with open(path, "wb") as f:
            f.write(data)
    return make


def _truncated_png(path):
    _image(os.path.dirname(path), "whole.bmp")
    from PIL import Image
    Image.open(os.path.join(os.path.dirname(path), "whole.bmp")).save(path)
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])
    os.remove(os.path.join(os.path.dirname(path), "whole.bmp"))


ACCEPTED = "give JPEG, PNG or BMP files"
BAD_IMAGES = {  # (the bad entry, how it is made, what the error says of it)
    "corrupt": ("c.jpg", _write(b"not an image" * 10),
                f"cannot be decoded as an image (truncated or corrupt?): {ACCEPTED}"),
    "empty": ("e.png", _write(b""), f"is empty: {ACCEPTED}"),
    "truncated png": ("t.png", _truncated_png, f"cannot be decoded as an image (truncated or "
                      f"corrupt?): {ACCEPTED}"),
    "a directory": ("x.jpg", os.makedirs, f"is a directory, not an image file: {ACCEPTED}"),
}


@pytest.mark.parametrize("case", list(BAD_IMAGES))
def test_a_bad_calibration_image_is_named_in_one_error(tiny, tmp_path, case):
    """A corrupt image gave "Error: Check failed: !res.empty(): Decoding failed.
    Invalid image file." without naming it; a directory named like an image,
    "Error: std::bad_alloc"; a truncated PNG, libpng's own line on stderr."""
    bad, make, message = BAD_IMAGES[case]
    path = _images_with(bad, make)(str(tmp_path / "images"))
    done = subprocess.run([*COMMAND, "quantize", tiny, "--calib", str(tmp_path / "images"),
                           "--shape", "data:1,3,8,8", "--out", str(tmp_path / "o")],
                          env=ENV, capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stderr.splitlines()) == (
        1, [f"Error: calibration image {path!r} {message}"])
    assert not any(text in done.stderr for text in CPP_TEXT)
