"""The hub's SuperLink command as its operator runs it, and what every Flower process
fedsieve starts runs with: Flower's bin found without a virtual environment on PATH,
Flower's telemetry and update check off, no SuperLink line per site poll, no install hint
from medmnist in a run's log."""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from benchmarks.sites.loopback import free_ports, port_open, stop_group
from flowerapp.certs import make_tls
from flowerapp.superlink import PollFilter
from tests.flower.conftest import FLOWER_BIN, Hub
from tests.flower.test_supernode import bare_env, group_commands, process_env
from tests.limits import limit


def test_the_superlink_command_works_from_a_bare_shell_with_flower_quiet(tmp_path: Path) -> None:
    make_tls(tmp_path / "certs")
    fleet, control, appio = free_ports(3)
    command = [
        str(FLOWER_BIN / "python"), "-m", "flowerapp.superlink", "--certs", "certs",
        "--database", "hub.db", "--fleet-api-address", f"127.0.0.1:{fleet}",
        "--control-api-address", f"127.0.0.1:{control}",
        "--serverappio-api-address", f"127.0.0.1:{appio}",
    ]  # fmt: skip
    with (tmp_path / "superlink.log").open("wb") as log:
        hub = subprocess.Popen(
            command, cwd=tmp_path, env=bare_env(tmp_path), stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + limit(60)
        while not all(map(port_open, (fleet, control, appio))) or not [
            pid for pid, cmd in group_commands(hub.pid).items() if "flower-superexec" in cmd
        ]:
            assert hub.poll() is None, (tmp_path / "superlink.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "superlink.log").read_text()
            time.sleep(0.2)
        superexec = next(p for p, c in group_commands(hub.pid).items() if "flower-superexec" in c)
        env = process_env(superexec)  # what the SuperLink started: the ServerApps' too
        assert env["FLWR_TELEMETRY_ENABLED"] == "0" and env["FLWR_DISABLE_UPDATE_CHECK"] == "1"
        assert env["PATH"].split(":")[0] == str(FLOWER_BIN)
    finally:
        stop_group(hub)
    assert (tmp_path / "hub.db").is_file()


def test_the_superlink_logs_no_line_per_poll(hub: Hub) -> None:
    log = (hub.fed.work / "superlink.log").read_text()
    assert "[Fleet.ActivateNode] Activated" in log  # its other INFO lines are kept
    assert "[Fleet.PullMessages]" not in log
    poll = logging.LogRecord(
        "flwr", logging.INFO, "", 0, "[Fleet.PullMessages] node_id=%s", (1,), None
    )
    failed = logging.LogRecord("flwr", logging.ERROR, "", 0, poll.msg, (1,), None)
    assert not PollFilter().filter(poll) and PollFilter().filter(failed)


def test_no_medmnist_install_hint_in_the_flower_environment(tmp_path: Path) -> None:
    code = "from federated.data import dataset_info; print(dataset_info('breastmnist').task)"
    done = subprocess.run(
        [str(FLOWER_BIN / "python"), "-c", code], env=bare_env(tmp_path), capture_output=True,
        text=True, timeout=limit(120), check=True,
    )  # fmt: skip
    assert done.stdout == "binary-class\n" and done.stderr == "", done


def test_a_site_decodes_the_compressed_dicom_an_archive_exports(tmp_path: Path) -> None:
    """A site reads its images in Flower's environment: the decoder plugins are there too."""
    code = (
        "from pydicom.data import get_testdata_file\n"
        "from federated.image_files import ImageSchema, decode_file\n"
        "for name in ('SC_rgb_jpeg_gdcm.dcm', 'JPGExtended.dcm', 'MR_small_jpeg_ls_lossless.dcm',"
        " 'MR_small_jp2klossless.dcm', 'MR_small_RLE.dcm'):\n"
        "    print(decode_file(get_testdata_file(name), ImageSchema(size=32)).pixels.shape)\n"
    )
    done = subprocess.run(
        [str(FLOWER_BIN / "python"), "-c", code], env=bare_env(tmp_path), capture_output=True,
        text=True, timeout=limit(120),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "(32, 32)\n" * 5
