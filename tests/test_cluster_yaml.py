"""cluster.yaml is a valid Ray cluster-launcher config (Ray's own schema, as `ray up` checks it)."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parent.parent / "cluster.yaml"


def _validate(config: dict) -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(copy.deepcopy(config)))


def test_cluster_yaml_passes_rays_launcher_schema():
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    _validate(config)
    nodes = config["available_node_types"]
    assert config["head_node_type"] in nodes
    assert any("gpu" in name for name in nodes if name != config["head_node_type"])
    setup = "\n".join(config["setup_commands"])
    # the nodes install the project from its own files, the same pins as `make install`
    assert "torch==2.13.0" in setup and "requirements/constraints.txt" in setup and "--no-deps" in setup
    # the dashboard (job API) stays on the head's loopback; `ray dashboard` tunnels to it over SSH
    assert "0.0.0.0" not in " ".join(config["head_start_ray_commands"])


def test_the_schema_check_is_not_vacuous():
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    config["available_node_types"]["head"]["not_a_field"] = 1
    with pytest.raises(jsonschema.ValidationError):
        _validate(config)
