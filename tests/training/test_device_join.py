"""The series that join a rank to the device layer: the NeuronCores of ``NEURON_RT_VISIBLE_CORES``, the instance id
(the option, the Nitro DMI file, the metadata service: read beside the training, never waited for), the
``runtime_tag`` and the ``process_tag`` option, and what a rank serves of them."""

from __future__ import annotations

import json
import logging
import os
import select
import subprocess
import sys
import urllib.request

import pytest

from neuron_exporter.training import instance_id as lookup_module
from neuron_exporter.training import neuroncores
from neuron_exporter.training.device_join import DeviceJoin
from neuron_exporter.training.instance_id import InstanceIdLookup, from_dmi, metadata_endpoint
from neuron_exporter.training.neuroncores import parse_cores, visible_cores
from neuron_exporter.training.process_tag import (
    PROCESS_TAG_ENV,
    apply_process_tag,
    readable_tag,
    runtime_started,
    runtime_tag,
)
from tests.support.daemon import free_port
from tests.support.metadata_service import MetadataService
from tests.support.paths import SCRIPTS
from tests.support.processes import wait_until, xla_env

ID = "i-0123456789abcdef0"


# -- NEURON_RT_VISIBLE_CORES ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "cores"),
    [
        ("3", (3,)),
        ("0-3", (0, 1, 2, 3)),
        ("0,2,4-7", (0, 2, 4, 5, 6, 7)),
        (" 6-7 , 1 ", (1, 6, 7)),
        ("0-3,2-5", (0, 1, 2, 3, 4, 5)),  # overlapping ranges: each core once
        ("5-5", (5,)),
        ("64-127", tuple(range(64, 128))),
    ],
)
def test_visible_cores_are_indices_ranges_and_lists_of_them(text, cores):
    assert parse_cores(text) == cores


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a", '"a" is neither a core index nor a range'),
        ("3-1", "the range 3-1 ends before it starts"),
        ("1-", '"1-" is neither'),
        ("-1", '"-1" is neither'),
        ("1,,2", '"" is neither'),
        ("1.5", '"1.5" is neither'),
        ("0x1", '"0x1" is neither'),
        ("\uff11", "is neither"),  # a fullwidth digit is not a core
        ("0-9999", "has more than 512 cores"),
        ("0-300,400-700", "more than 512 cores"),
    ],
)
def test_garbage_is_no_list_of_cores_and_says_why(text, problem):
    with pytest.raises(ValueError, match="^.*" + problem.replace("(", r"\(")):
        parse_cores(text)


def collect(join: DeviceJoin) -> dict[str, list]:
    return {family.name: family.samples for family in join.collect({"run_id": "r", "rank": "3", "local_rank": "3"})}


def given(instance: str | None = ID) -> DeviceJoin:
    return DeviceJoin(InstanceIdLookup(instance, on_error=pytest.fail))


def test_garbage_cores_give_one_warning_and_no_core_series(monkeypatch, caplog):
    neuroncores._warned.clear()
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "2-x")
    join = given()
    with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
        for _ in range(3):
            families = collect(join)
    assert "neuron_exporter_neuroncore_info" not in families
    assert len(families["neuron_exporter_process_info"]) == 1  # the process still joins on its runtime_tag
    (warning,) = [record.getMessage() for record in caplog.records]
    assert warning.startswith('neuron-exporter: NEURON_RT_VISIBLE_CORES="2-x" is not used: "2-x" is neither')
    assert visible_cores({"NEURON_RT_VISIBLE_CORES": "2-x"}) == ()


def test_a_rank_serves_its_process_and_each_of_its_cores(monkeypatch):
    monkeypatch.setenv("NEURON_RT_VISIBLE_CORES", "4-5")
    monkeypatch.setenv("NEURON_LOGICAL_NC_CONFIG", "2")
    monkeypatch.delenv(PROCESS_TAG_ENV, raising=False)
    families = collect(given())
    (process,) = families["neuron_exporter_process_info"]
    assert process.labels == {
        "run_id": "r",
        "rank": "3",
        "local_rank": "3",
        "instance_id": ID,
        "runtime_tag": str(os.getpid()),
        "pid": str(os.getpid()),
    }
    cores = families["neuron_exporter_neuroncore_info"]
    assert [(s.labels["neuroncore"], s.labels["logical_nc_config"], s.value) for s in cores] == [
        ("4", "2", 1),
        ("5", "2", 1),
    ]
    assert {s.labels["instance_id"] for s in cores} == {ID}


def test_no_cores_without_the_variable_and_nothing_after_detach(monkeypatch):
    monkeypatch.delenv("NEURON_RT_VISIBLE_CORES", raising=False)
    join = given(None)
    join.instance_id._done.set()  # looked up, found nothing: absent, not guessed
    families = collect(join)
    assert list(families) == ["neuron_exporter_process_info"]
    assert families["neuron_exporter_process_info"][0].labels["instance_id"] == ""
    join.stopped = True
    assert collect(join) == {}


# -- the instance id ------------------------------------------------------------------------------------------------
def test_the_dmi_file_names_the_instance_when_present(tmp_path):
    (tmp_path / "board_asset_tag").write_text(ID + "\n")
    assert from_dmi(tmp_path / "board_asset_tag") == ID


@pytest.mark.parametrize(
    "content", [None, "dir", b"Default string\n", b"", b"i-0123\n", b"\xff\xfe", b"I-0123456789ABCDEF0"]
)
def test_an_absent_unreadable_or_foreign_dmi_file_names_no_instance(tmp_path, content):
    path = tmp_path / "board_asset_tag"
    if content == "dir":
        path.mkdir()  # open() fails as for an unreadable file (root reads every file whatever its mode)
    elif content is not None:
        path.write_bytes(content)
    assert from_dmi(path) is None


def lookup_of(tmp_path, env: dict[str, str], given_id: str | None = None) -> InstanceIdLookup:
    return InstanceIdLookup(given_id, on_error=pytest.fail, dmi_path=tmp_path / "absent", env=env)


def test_without_a_dmi_file_the_metadata_service_names_the_instance(tmp_path):
    with MetadataService(ID) as service:
        lookup = lookup_of(tmp_path, {"AWS_EC2_METADATA_SERVICE_ENDPOINT": service.url + "/"})
        lookup.start()
        assert lookup.wait(30) and lookup.value == ID
    assert service.requests == [("PUT", "/latest/api/token"), ("GET", "/latest/meta-data/instance-id")]


def test_the_dmi_file_comes_first_and_the_option_before_both(tmp_path):
    (tmp_path / "tag").write_text(ID)
    with MetadataService("i-0fedcba9876543210") as service:
        env = {"AWS_EC2_METADATA_SERVICE_ENDPOINT": service.url}
        from_file = InstanceIdLookup(None, on_error=pytest.fail, dmi_path=tmp_path / "tag", env=env)
        from_file.start()
        assert from_file.wait(30) and from_file.value == ID
        option = lookup_of(tmp_path, env, given_id="i-00000000000000001")
        option.start()
        assert option.done and option.value == "i-00000000000000001"
    assert service.requests == []


def test_a_metadata_service_that_is_down_or_off_names_no_instance(tmp_path, caplog):
    for env in (
        {"AWS_EC2_METADATA_SERVICE_ENDPOINT": f"http://127.0.0.1:{free_port()}"},  # nothing listens there
        {"AWS_EC2_METADATA_DISABLED": "true"},
    ):
        lookup = lookup_of(tmp_path, env)
        lookup.start()
        assert lookup.wait(30) and lookup.value is None
    assert caplog.records == []


def test_a_metadata_endpoint_that_is_no_url_is_said_once_and_not_asked(caplog):
    with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
        assert metadata_endpoint({"AWS_EC2_METADATA_SERVICE_ENDPOINT": "169.254.169.254"}) is None
    assert [r.getMessage() for r in caplog.records] == [
        'neuron-exporter: AWS_EC2_METADATA_SERVICE_ENDPOINT="169.254.169.254" is not an http:// or https:// URL: '
        "the instance id is not looked up there"
    ]


def test_start_returns_while_the_metadata_service_keeps_its_answer(tmp_path, monkeypatch):
    """No start-up delay, seen in the order of events: the look-up has not ended when ``start()`` returns, nor while
    the service holds the request; it ends with the service's answer."""
    monkeypatch.setattr(lookup_module, "TIMEOUT_SECONDS", 600.0)  # only the answer can end it
    with MetadataService(ID) as service:
        service.hold()
        lookup = lookup_of(tmp_path, {"AWS_EC2_METADATA_SERVICE_ENDPOINT": service.url})
        lookup.start()
        assert not lookup.done
        wait_until(lambda: service.requests, what="the token request")
        assert not lookup.done and lookup.value is None
        service.release()
        assert lookup.wait(30) and lookup.value == ID


@pytest.mark.training
def test_attach_returns_and_trains_while_the_metadata_service_keeps_its_answer(tmp_path):
    """attach() in a training process returns before the metadata service answers, the process trains meanwhile,
    and its process series come once the answer does, with the instance id it gave."""
    with MetadataService("i-0fedcba9876543210") as service:
        service.hold()
        env = xla_env(AWS_EC2_METADATA_SERVICE_ENDPOINT=service.url, NEURON_RT_VISIBLE_CORES="0-1")
        process = subprocess.Popen(
            [sys.executable, str(SCRIPTS / "instance_id_attach.py"), str(tmp_path / "no-dmi-file")],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            ready, _, _ = select.select([process.stdout], [], [], 300)
            assert ready, "instance_id_attach.py did not start"
            started = json.loads(process.stdout.readline())
            assert started["looked_up"] is False

            def scrape() -> str:
                with urllib.request.urlopen(started["url"], timeout=30) as response:
                    return response.read().decode()

            wait_until(lambda: service.requests, what="the token request")
            trained = wait_until(lambda: "training_steps_total{" in scrape() and scrape(), what="training steps")
            assert "neuron_exporter_process_info" not in trained  # the answer is still held
            service.release()
            joined = wait_until(lambda: "neuron_exporter_process_info{" in scrape() and scrape(), what="the join")
            assert 'instance_id="i-0fedcba9876543210"' in joined
            assert joined.count("neuron_exporter_neuroncore_info{") == 2
        finally:
            process.stdin.close()
            process.wait(timeout=60)
    assert process.returncode == 0, process.stderr.read()[-4000:]


# -- runtime_tag and the process_tag option -------------------------------------------------------------------------
LABELS = {"run_id": "job-7", "rank": "3", "local_rank": "3"}


def descriptors(table, device: str):
    """A descriptor table (as /proc/self/fd) holding ``device`` open."""
    table.mkdir(parents=True)
    (table / "0").symlink_to("/dev/null")
    (table / "7").symlink_to(device)
    return table


def test_the_runtime_has_started_once_it_holds_a_neuron_device(tmp_path):
    assert runtime_started(descriptors(tmp_path / "neuron", "/dev/neuron0"))
    assert not runtime_started(descriptors(tmp_path / "other", "/dev/shm/x"))
    assert not runtime_started(tmp_path / "no-proc")
    assert not runtime_started()  # this test process holds no Neuron device


def test_the_tag_names_the_rank_or_before_a_launcher_says_it_the_process():
    assert readable_tag(LABELS, {"RANK": "3"}) == "job-7.rank3"
    assert readable_tag(LABELS, {}) == f"job-7.pid{os.getpid()}"


def test_the_option_tags_the_process_before_the_runtime_starts(tmp_path):
    env = {"RANK": "3"}
    apply_process_tag(LABELS, env, fd_dir=tmp_path / "no-proc")
    assert env[PROCESS_TAG_ENV] == "job-7.rank3"
    assert runtime_tag(env) == "job-7.rank3"
    inherited = {"RANK": "5", PROCESS_TAG_ENV: "job-7.rank0"}  # set for the launcher this worker was started from
    apply_process_tag({**LABELS, "rank": "5"}, inherited, fd_dir=tmp_path / "no-proc")
    assert inherited[PROCESS_TAG_ENV] == "job-7.rank5"


def test_attach_tags_the_process_and_a_forked_worker_gets_a_tag_of_its_own(tmp_path):
    env = xla_env(NEURON_EXPORTER_RUN_ID="job-7")
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "process_tag_fork.py"), str(tmp_path / "spool")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    parent, child = (json.loads(line) for line in done.stdout.splitlines())
    assert parent["tag"] == f"job-7.pid{parent['pid']}" and child["tag"] == f"job-7.pid{child['pid']}"


def test_a_tag_of_the_users_own_is_left_as_it_is(tmp_path):
    env = {"RANK": "3", PROCESS_TAG_ENV: "my-trainer"}
    apply_process_tag(LABELS, env, fd_dir=tmp_path / "no-proc")
    assert env[PROCESS_TAG_ENV] == "my-trainer" and runtime_tag(env) == "my-trainer"


def test_too_late_is_said_in_one_line_and_the_tag_left(tmp_path, caplog):
    env = {"RANK": "3"}
    with caplog.at_level(logging.INFO, logger="neuron_exporter"):
        apply_process_tag(LABELS, env, fd_dir=descriptors(tmp_path / "fd", "/dev/neuron3"))
    assert PROCESS_TAG_ENV not in env and runtime_tag(env) == str(os.getpid())
    (line,) = [record.getMessage() for record in caplog.records]
    assert "the Neuron runtime started in this process before attach()" in line
    assert f'runtime_tag="{os.getpid()}"' in line


def test_a_tag_the_runtime_would_not_keep_gives_one_warning_and_no_tag(caplog):
    for tag in ("x" * 256, "a\nb"):
        with caplog.at_level(logging.WARNING, logger="neuron_exporter"):
            assert runtime_tag({PROCESS_TAG_ENV: tag}) == "" and runtime_tag({PROCESS_TAG_ENV: tag}) == ""
    assert len(caplog.records) == 2
    assert runtime_tag({PROCESS_TAG_ENV: "x" * 255}) == "x" * 255
