"""The site operator's side before any Flower process starts: ``fedsieve-site`` refuses a
data file, a plan or a key it cannot use in one line (exit 2); the training plan the hub
writes (``fedsieve plan``) is what its tasks carry, and a departure from it is named."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from config.dataset import dataset_info_of
from config.params import Params, load_params, validate_params
from federated.data import dataset_info
from flowerapp.certs import make_site_key, make_tls
from flowerapp.hub import site_task
from flowerapp.plan import PlanError, plan_differences, plan_digest, read_plan, write_plan
from flowerapp.site import main as site_main
from flowerapp.site import supernode_command
from flowerapp.site_data import SiteDataError, load_site_data
from tests.limits import limit

REPO = Path(__file__).resolve().parents[2]


def own_params(size: int = 28, **own: object) -> Params:
    """Params of a two-class grey dataset of the site's own images."""
    schema = {"task": "binary-class", "classes": ["benign", "malignant"]} | own
    return Params.model_validate(
        {"data": {"dataset": "breast-own", "size": size, "own": schema},
         "model": {"name": "logreg"}, "federation": {"runtime": "flower", "sites": [
             {"name": "a", "node_id": 1, "samples": 3}]}, "noniid": {"every": 0, "final": False},
         "eval": {"where": "sites"}}
    )  # fmt: skip


def plan_of(folder: Path, **own: object) -> Path:
    """A plan file whose task holds ``own`` in its schema (8-pixel images)."""
    task = site_task(own_params(8), dataset_info_of(own_params(8).data))
    names = tuple(own.get("classes", task.class_names))  # type: ignore[arg-type]
    task = replace(task, class_names=names, classes=len(names), task=own.get("task", task.task))
    path = folder / f"plan-{len(list(folder.glob('plan-*')))}.json"
    write_plan(path, task)
    return path


def site_file(path: Path, **arrays: np.ndarray | None) -> Path:
    """A site file of four 8x8 images (three to train on), with ``arrays`` replacing any
    (``None``: left out)."""
    images = np.zeros((4, 8, 8), np.uint8)
    labels = np.array([[0], [1], [0], [1]])
    default = {"train_images": images[:3], "train_labels": labels[:3], "test_images": images[3:],
               "test_labels": labels[3:]}  # fmt: skip
    np.savez(path, **{k: v for k, v in (default | arrays).items() if v is not None})
    return path


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"train_images": np.zeros((3, 8, 8), np.float32)}, "train_images is float32"),
        ({"train_labels": np.array([[0], [1]])}, "train_labels (int64, 2 rows) does not match"),
        ({"train_images": np.zeros((0, 8, 8), np.uint8), "train_labels": np.zeros((0, 1), int)},
         "train_images is empty"),
        ({"test_images": np.zeros((1, 9, 9), np.uint8)}, "test_images and train_images differ"),
    ],
)  # fmt: skip
def test_a_data_file_that_cannot_be_trained_on_is_named_with_why(
    tmp_path: Path, arrays: dict[str, np.ndarray], message: str
) -> None:
    path = site_file(tmp_path / "site.npz", **arrays)
    with pytest.raises(SiteDataError, match="^" + str(path)) as error:
        load_site_data(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_site_command_stops_in_one_line_before_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = site_file(tmp_path / "site.npz")
    (tmp_path / "not.npz").write_text("images")
    plan, partial = tmp_path / "plan.json", tmp_path / "partial.json"
    write_plan(plan, site_task(own_params(size=8), dataset_info_of(own_params(size=8).data)))
    write_plan(partial, {"model": "logreg", "lr": 0.05})
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "labels.csv").write_text("file,label\nmissing.png,benign\n")
    make_tls(tmp_path)  # ca.crt: the data and plan are checked first
    make_site_key(tmp_path, "site")
    common = ["--superlink", "hub:9092", "--ca", str(tmp_path / "ca.crt")]
    cases = {
        "not a readable .npz file of arrays": [
            "--data", str(tmp_path / "not.npz"), "--plan", str(plan)
        ],
        "row 2: missing.png: No such file": ["--data", str(folder), "--plan", str(plan)],
        "not a training plan": ["--data", str(good), "--plan", str(partial)],
        "labels up to 1; the task has 1 classes": [
            "--data", str(good), "--plan", str(plan_of(tmp_path, classes=["only"], task="multi-class"))
        ],
        "missing train_labels": [
            "--data", str(site_file(tmp_path / "bad.npz", train_labels=None)), "--plan", str(plan)
        ],
        "not JSON": ["--data", str(good), "--plan", str(tmp_path / "site.key")],
        "No such file or directory": ["--data", str(good), "--plan", str(tmp_path / "none.json")],
        "--key": ["--data", str(good), "--plan", str(plan), "--key", str(tmp_path / "none.key")],
    }  # fmt: skip
    for message, argv in cases.items():
        key = [] if "--key" in argv else ["--key", str(tmp_path / "site.key")]
        assert site_main([*argv, *common, *key]) == 2, message
        error = capsys.readouterr().err
        assert error.startswith("fedsieve-site: error: ") and error.count("\n") == 1, error
        assert message in error


def test_the_hubs_plan_is_what_its_tasks_carry_and_a_departure_is_named(
    tmp_path: Path, medmnist_root: Path
) -> None:
    written = subprocess.run(
        [str(Path(sys.executable).parent / "fedsieve"), "plan", "--set", "train.lr=0.02",
         "--out", str(tmp_path / "plan.json")],
        cwd=REPO, env=os.environ | {"MEDMNIST_ROOT": str(medmnist_root)},
        capture_output=True, text=True, timeout=limit(120),
    )  # fmt: skip
    assert written.returncode == 0, written.stderr
    params = load_params(REPO / "params.yaml", ["train.lr=0.02"])
    task = site_task(params, dataset_info(params.data.dataset, params.data.size))
    plan = read_plan(tmp_path / "plan.json")
    assert plan == task.plan() and plan["lr"] == 0.02
    assert written.stdout.strip().endswith(f"sha256 {plan_digest(task)}")

    sent = replace(task, round=3, client=1, shuffle_seed=12345)  # per message: not the plan
    assert plan_differences(plan, sent) == []
    assert plan_digest(sent) == plan_digest(plan)
    bolder = replace(sent, lr=0.5, epochs=task.epochs + 1)
    assert plan_differences(plan, bolder) == [
        f"epochs={task.epochs + 1} (approved {task.epochs})",
        "lr=0.5 (approved 0.02)",
    ]

    (tmp_path / "list.json").write_text(json.dumps([1, 2]))
    with pytest.raises(PlanError, match="must be a JSON object of settings"):
        read_plan(tmp_path / "list.json")


def test_the_privacy_a_site_is_promised_is_in_its_plan_and_local_dp_can_be_insisted_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The task carries the privacy settings, so a plan pinned with local DP refuses a
    task with less noise or privacy off; ``fedsieve-site --local-dp`` refuses to start on
    a plan without local DP, whatever else it says."""
    info = dataset_info("digits")
    local = site_task(
        validate_params({"privacy": {"mode": "local", "clip": 0.5, "noise_multiplier": 2.0,
                                     "target_epsilon": 9.0}}, "params.yaml"), info,
    )  # fmt: skip
    assert {k: v for k, v in local.plan().items() if k.startswith("privacy_")} == {
        "privacy_mode": "local", "privacy_clip": 0.5, "privacy_noise_multiplier": 2.0,
        "privacy_delta": 1e-5, "privacy_target_epsilon": 9.0,
    }  # fmt: skip
    off = site_task(validate_params({}, "params.yaml"), info)
    assert off.privacy_mode == "off" and off.privacy_noise_multiplier == 0.0
    assert plan_differences(local, replace(local, privacy_noise_multiplier=1.0)) == [
        "privacy_noise_multiplier=1.0 (approved 2.0)"
    ]
    assert "privacy_mode=off (approved local)" in plan_differences(local, off)

    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "site.key").write_text("")
    digits_sized = {"train_images": np.zeros((3, 28, 28), np.uint8),
                    "test_images": np.zeros((1, 28, 28), np.uint8)}  # fmt: skip
    argv = ["--data", str(site_file(tmp_path / "site.npz", **digits_sized)), "--superlink", "hub:9092",
            "--ca", str(tmp_path / "ca.crt"), "--key", str(tmp_path / "site.key"), "--local-dp"]  # fmt: skip
    write_plan(tmp_path / "plan.json", off)
    assert site_main([*argv, "--plan", str(tmp_path / "plan.json")]) == 2
    assert capsys.readouterr().err == (
        f"fedsieve-site: error: --local-dp: plan {tmp_path / 'plan.json'} has privacy_mode "
        "off; this site trains only with privacy_mode local\n"
    )
    command = supernode_command(
        tmp_path / "site.npz", tmp_path / "plan.json", "hub:9092", tmp_path / "ca.crt",
        tmp_path / "site.key", local_dp=True,
    )  # fmt: skip
    assert command[-1].endswith(" require-local-dp=true")


def test_a_scaffold_plan_needs_the_sites_state_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SCAFFOLD keeps the site's control variate on its own disk: ``fedsieve-site`` refuses
    a plan with ``scaffold: true`` without ``--state``, and gives the folder to its
    SuperNode as node config."""
    scaffold = site_task(
        validate_params({"train": {"scaffold": True, "momentum": 0}}, "params.yaml"),
        dataset_info("digits"),
    )
    write_plan(tmp_path / "plan.json", scaffold)
    (tmp_path / "ca.crt").write_text("")
    (tmp_path / "site.key").write_text("")
    digits_sized = {"train_images": np.zeros((3, 28, 28), np.uint8),
                    "test_images": np.zeros((1, 28, 28), np.uint8)}  # fmt: skip
    argv = ["--data", str(site_file(tmp_path / "site.npz", **digits_sized)), "--superlink", "hub:9092",
            "--ca", str(tmp_path / "ca.crt"), "--key", str(tmp_path / "site.key"),
            "--plan", str(tmp_path / "plan.json")]  # fmt: skip

    assert site_main(argv) == 2
    assert capsys.readouterr().err == (
        f"fedsieve-site: error: plan {tmp_path / 'plan.json'} has scaffold: true: this site "
        "keeps its control variate in its own state folder; give --state DIR\n"
    )
    command = supernode_command(
        tmp_path / "site.npz", tmp_path / "plan.json", "hub:9092", tmp_path / "ca.crt",
        tmp_path / "site.key", folders={"state-dir": tmp_path / "state"},
    )  # fmt: skip
    assert command[-1].endswith(f' state-dir="{tmp_path / "state"}"')


def test_a_site_checks_its_own_folder_against_the_plan_and_prints_what_to_register(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from federated.data import Split
    from federated.own_data import write_image_folder

    images, labels = (
        np.arange(4 * 64, dtype=np.uint8).reshape(4, 8, 8),
        np.array([[0], [1], [0], [1]]),
    )
    splits = {"train": Split(images[:3], labels[:3]), "test": Split(images[3:], labels[3:])}
    write_image_folder(tmp_path / "images", splits, ("benign", "malignant"), image_format="dcm")
    plan = tmp_path / "plan.json"
    write_plan(plan, site_task(own_params(size=8), dataset_info_of(own_params(size=8).data)))
    make_tls(tmp_path)
    make_site_key(tmp_path, "site")
    monkeypatch.setenv("FEDSIEVE_CACHE", str(tmp_path / "site-cache"))

    code = site_main(["--data", str(tmp_path / "images"), "--plan", str(plan), "--superlink",
                      "hub:9092", "--ca", str(tmp_path / "ca.crt"), "--key",
                      str(tmp_path / "site.key"), "--check"])  # fmt: skip

    assert code == 0
    out = capsys.readouterr().out
    assert "images: 3 training, 1 test and 0 validation images fit" in out
    assert out.rstrip().endswith("register samples: 3")
    assert len(list((tmp_path / "site-cache").glob("*.npz"))) == 1  # the trainer reads that

    wider = Split(np.zeros((2, 12, 12), np.uint8), labels[:2])  # two exported at 12 px
    write_image_folder(tmp_path / "mixed", splits | {"val": wider}, ("benign", "malignant"))
    code = site_main(["--data", str(tmp_path / "mixed"), "--plan", str(plan), "--superlink",
                      "hub:9092", "--ca", str(tmp_path / "ca.crt"), "--key",
                      str(tmp_path / "site.key"), "--check"])  # fmt: skip
    assert code == 0
    assert (
        "2 validation images fit the approved plan " in (out := capsys.readouterr().out)
        and "; 2 images resized to 8x8 (2 from 12x12); warning: the images have mixed sizes" in out
    )


def test_volumes_of_another_size_than_the_plans_are_refused_in_one_line(tmp_path: Path) -> None:
    labels = np.array([[0], [1]])
    volumes = site_file(
        tmp_path / "volumes.npz", train_images=np.zeros((2, 8, 8, 8), np.uint8),
        train_labels=labels, test_images=np.zeros((0, 8, 8, 8), np.uint8),
        test_labels=labels[:0],
    )  # fmt: skip
    data = load_site_data(volumes)

    data.check_fits(channels=1, size=8, classes=2, multi_label=False, spatial_dims=3)
    with pytest.raises(SiteDataError) as error:
        data.check_fits(channels=1, size=16, classes=2, multi_label=False, spatial_dims=3)
    assert str(error.value) == (
        "volumes.npz: volumes are 8x8x8 with 1 channel(s); the task's model takes 16x16x16 with 1"
    )
    with pytest.raises(SiteDataError, match=r"volumes are 8x8x8 .* takes 8x8 with 1$"):
        data.check_fits(channels=1, size=8, classes=2, multi_label=False)


def test_sites_of_volumes_are_written_each_in_the_next_form_a_hospital_stores(
    tmp_path: Path, adrenal_root: Path
) -> None:
    from dataclasses import replace as changed

    from federated.data import MedMNISTData, Split, load_medmnist
    from federated.own_data import load_own_images
    from flowerapp.site_data import write_site_files

    official = load_medmnist("adrenalmnist3d", adrenal_root, 64)
    small = Split(np.ascontiguousarray(official.train.images[:9, ::8, ::8, ::8]),
                  official.train.labels[:9])  # fmt: skip
    data = MedMNISTData(changed(official.info, size=8), small, small, small)
    parts = [np.arange(k * 3, k * 3 + 2) for k in range(3)]
    held = [np.arange(k * 3 + 2, k * 3 + 3) for k in range(3)]

    sites = write_site_files(data, parts, held, ["a", "b", "c"], tmp_path, "volumes")

    forms = [sorted(p.name for p in (tmp_path / site / "train").iterdir()) for site in "abc"]
    assert forms == [
        ["00000.nii.gz", "00001.nii.gz"],
        ["00000", "00001"],
        ["00000.dcm", "00001.dcm"],
    ]
    for site, part in zip(sites, parts, strict=True):
        read = load_own_images(tmp_path / site["name"], data.info)
        assert site["sha256"] == read.sha256 and site["samples"] == 2
        assert np.array_equal(read.split("train").images, small.images[part])


def test_a_site_reads_its_volumes_in_the_plan_and_names_a_broken_series_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from federated.data import Split
    from federated.volume_writers import write_volume_folder

    volumes = np.zeros((3, 8, 8, 8), np.uint8)
    volumes[:, 2:6, 2:6, 2:6] = 255  # a cube in each
    labels = np.array([[0], [1], [0]])
    splits = {"train": Split(volumes[:2], labels[:2]), "test": Split(volumes[2:], labels[2:])}
    write_volume_folder(tmp_path / "ct", splits, ("normal", "mass"), forms=("series",))
    schema = {"task": "binary-class", "classes": ["normal", "mass"], "spatial_dims": 3}
    params = Params.model_validate(
        {"data": {"dataset": "ct", "size": 8, "own": schema}, "model": {"name": "small_cnn3d"},
         "federation": {"runtime": "flower", "sites": [{"name": "a", "node_id": 1, "samples": 2}]},
         "noniid": {"every": 0, "final": False}, "eval": {"where": "sites"}}
    )  # fmt: skip
    plan = tmp_path / "plan.json"
    write_plan(plan, site_task(params, dataset_info_of(params.data)))
    make_tls(tmp_path)
    make_site_key(tmp_path, "site")
    monkeypatch.setenv("FEDSIEVE_CACHE", str(tmp_path / "site-cache"))
    check = ["--data", str(tmp_path / "ct"), "--plan", str(plan), "--superlink", "hub:9092",
             "--ca", str(tmp_path / "ca.crt"), "--key", str(tmp_path / "site.key"), "--check"]  # fmt: skip

    assert site_main(check) == 0
    assert "ct: 2 training, 1 test and 0 validation volumes fit the approved plan" in (
        capsys.readouterr().out
    )
    (tmp_path / "ct" / "train" / "00001" / "0004.dcm").unlink()  # a slice lost in the export
    assert site_main(check) == 2
    error = capsys.readouterr().err
    assert error.startswith("fedsieve-site: error: ") and error.count("\n") == 1, error
    assert "train/00001" in error and "slices missing or unevenly spaced" in error, error


def test_the_intensity_policy_is_pinned_in_the_plan_every_site_approves() -> None:
    params = own_params(8, intensity="percentiles", percentiles=[1, 99])
    task = site_task(params, dataset_info_of(params.data))

    assert (task.plan()["intensity"], task.plan()["percentiles"]) == ("percentiles", [1.0, 99.0])
    assert task.dataset_info().image_schema().percentiles == (1.0, 99.0)
    assert plan_differences(task.plan(), replace(task, intensity="range")) == [
        "intensity=range (approved percentiles)"
    ]


def test_a_hub_certificate_not_issued_for_the_address_the_site_dials_is_named(
    tmp_path: Path,
) -> None:
    """Flower's SuperNode retries a host-name mismatch without end; the site's handshake
    before it starts names it (exit 4), and lets a hub whose certificate fits, or that is
    not up yet, through to the SuperNode."""
    import socket
    import ssl
    import threading

    from flowerapp.site import hub_certificate_problem

    def serve(hosts: tuple[str, ...]) -> tuple[str, Path]:
        tls = make_tls(tmp_path / hosts[0], hosts)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(tls.server_cert, tls.server_key)
        listener = socket.create_server(("127.0.0.1", 0))

        def accept() -> None:
            connection, _ = listener.accept()
            with listener, connection, contextlib.suppress(ssl.SSLError, OSError):
                context.wrap_socket(connection, server_side=True).close()

        threading.Thread(target=accept, daemon=True).start()
        return f"127.0.0.1:{listener.getsockname()[1]}", tls.ca_cert

    address, ca = serve(("hub.example",))
    problem = hub_certificate_problem(address, ca)
    assert problem is not None and "not issued for the host name 127.0.0.1" in problem, problem
    assert "IP address mismatch" in problem and "\n" not in problem

    address, ca = serve(("127.0.0.1",))
    assert hub_certificate_problem(address, ca) is None
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    assert hub_certificate_problem(f"127.0.0.1:{port}", ca) is None  # not up yet: retried
