"""The suite's fixtures: plugins in support/fixtures/, each with the resources of one kind."""

pytest_plugins = [
    "support.fixtures.apiserver",
    "support.fixtures.chart",
    "support.fixtures.kube",
    "support.fixtures.models",
    "support.fixtures.processes",
    "support.fixtures.redis",
    "support.fixtures.servers",
    "support.fixtures.vllm",
]
