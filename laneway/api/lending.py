"""spec.lending: an interactive pool lends whole idle replicas to a batch pool and takes
them back when chat needs them (issue 26). Only another pool's prompts can run on a lent
replica's engine, so `laneway.api.check_pool_set` holds the borrower to what this pool's
engine serves: the same model, prompts within its context cap."""

from __future__ import annotations

from pydantic import Field

from laneway.api.names import MAX_REPLICAS
from laneway.api.wire import Wire


class LendingSpec(Wire):
    borrower: str = Field(
        min_length=1,
        max_length=253,  # a Kubernetes object name's most
        description="The batch InferencePool, in this pool's namespace, that borrows this "
        "pool's idle replicas. It must serve the same model, and its prompts must fit this "
        "pool's limits.maxContextTokens: a lent replica runs its requests on this pool's "
        "engine.",
    )
    keep_replicas: int = Field(
        default=1,
        ge=1,
        le=MAX_REPLICAS,
        description="Replicas never lent, whatever chat's demand: the ones a sudden turn "
        "lands on while a lent replica is being taken back.",
    )
    headroom: float = Field(
        default=0.25,
        ge=0,
        lt=1,
        description="Share of a replica's SLO capacity the gateway keeps free when it packs "
        "chat onto as few replicas as possible, before lending the rest.",
    )
