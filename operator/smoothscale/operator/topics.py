"""The topics a StreamingApp owns, created, and the topics it uses, checked, on its Kafka cluster.

The operator owns each state store's changelog, the assignments topic and the dead-letter topic:
it creates the missing ones. The input and output topics are the user's: it only checks them.

Input partitions added while the app runs are new tasks: a changelog with fewer partitions than
the input is grown to match (CreatePartitions), which moves no record, so every existing task
keeps its state in its partition and each new task starts from an empty one. A topic that is
wrong in a way that could lose state is reported, never "fixed", so a person decides: a
changelog with more partitions than the input (an input cannot shrink: it is another input's
changelog, or the input was re-created), or a changelog whose retention would delete state.

Every check is batched (one Metadata request for all topics, one CreateTopics for every missing
topic, one CreatePartitions for every changelog to grow, one DescribeConfigs for every existing
changelog) so an app with many stores costs the cluster three requests per reconciliation.
"""

from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.cimpl import NewPartitions, NewTopic

from smoothscale.api.models import StreamingApp, application_id
from smoothscale.kafka import names

_COMPACTED = {"cleanup.policy": "compact"}
_BROKER_DEFAULT_REPLICATION = -1


@dataclass(frozen=True)
class TopicProblem:
    """Something wrong with a topic the app needs, for a condition on the StreamingApp."""

    reason: str
    """CamelCase: InputTopicMissing, InputTopicsNotCoPartitioned, OutputTopicMissing,
    ChangelogPartitionsMismatch, ChangelogRetention, KafkaUnavailable, TopicCreationFailed,
    ChangelogGrowthFailed."""
    topic: str | None
    message: str
    """What is wrong and what to do, naming the topic."""


@dataclass(frozen=True)
class TopicCheck:
    partitions: int | None
    """The task count: the input topics' partition count (None when they disagree or are
    missing)."""
    created: tuple[str, ...]
    """The topics this check created."""
    grown: tuple[str, ...]
    """The changelogs this check grew to the input's partition count."""
    problems: tuple[TopicProblem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems


class TopicManager:
    """Creates and checks the topics of StreamingApps on one Kafka cluster.

    `client_config` is librdkafka configuration (bootstrap.servers, security); `timeout`
    bounds each request to the cluster, in seconds.
    """

    def __init__(self, client_config: Mapping[str, str], timeout: float = 10.0) -> None:
        self._admin: AdminClient | None = AdminClient(dict(client_config))
        self._timeout = timeout
        self._bootstrap = client_config.get("bootstrap.servers", "?")

    def _client(self) -> AdminClient:
        if self._admin is None:
            raise RuntimeError("this TopicManager is closed")
        return self._admin

    def ensure(self, app: StreamingApp) -> TopicCheck:
        """Create the app's missing owned topics and check all of them; idempotent. Kafka
        trouble comes back as a problem (KafkaUnavailable, TopicCreationFailed), never raised."""
        admin = self._client()
        try:
            metadata = admin.list_topics(timeout=self._timeout)
        except KafkaException as error:
            return TopicCheck(None, (), (), (self._unreachable(error),))
        counts = {name: len(topic.partitions) for name, topic in metadata.topics.items()}
        kafka = app.spec.kafka
        app_id = application_id(app)
        problems: list[TopicProblem] = []
        partitions = self._input_partitions(kafka.input_topics, counts, problems)
        if kafka.output_topic not in counts:
            problems.append(
                TopicProblem(
                    "OutputTopicMissing",
                    kafka.output_topic,
                    f"output topic {kafka.output_topic!r} does not exist: create it (the operator "
                    "does not create the app's input and output topics)",
                )
            )
        changelogs = [
            names.changelog_topic(app_id, store.name, store.changelog_topic)
            for store in kafka.state_stores
        ]
        missing: list[NewTopic] = []
        to_grow: list[NewPartitions] = []
        existing_changelogs = []
        for changelog in changelogs:
            if changelog not in counts:
                if partitions is not None:
                    missing.append(
                        NewTopic(
                            changelog, partitions, _BROKER_DEFAULT_REPLICATION, config=_COMPACTED
                        )
                    )
                continue
            existing_changelogs.append(changelog)
            if partitions is None:
                continue
            if counts[changelog] < partitions:
                to_grow.append(NewPartitions(changelog, partitions))
            elif counts[changelog] > partitions:
                problems.append(
                    TopicProblem(
                        "ChangelogPartitionsMismatch",
                        changelog,
                        f"changelog topic {changelog!r} has {counts[changelog]} partitions but "
                        f"the input topics have {partitions}: task i restores from partition i "
                        "and an input never loses partitions, so this changelog is not this "
                        "input's; point the store at another changelogTopic, or delete the "
                        "changelog (its state is lost) for the operator to create it again",
                    )
                )
        assignments = names.assignments_topic(app_id)
        if assignments not in counts:
            missing.append(NewTopic(assignments, 1, _BROKER_DEFAULT_REPLICATION, config=_COMPACTED))
        dead_letters = names.dead_letter_topic(app_id, kafka.dead_letter_topic)
        if dead_letters not in counts and partitions is not None:
            missing.append(NewTopic(dead_letters, partitions, _BROKER_DEFAULT_REPLICATION))
        created = self._create(missing, problems)
        grown = self._grow(to_grow, problems)
        problems.extend(self._retention_problems(existing_changelogs))
        return TopicCheck(partitions, tuple(created), tuple(grown), tuple(problems))

    def _input_partitions(
        self, inputs: list[str], counts: Mapping[str, int], problems: list[TopicProblem]
    ) -> int | None:
        for topic in inputs:
            if topic not in counts:
                problems.append(
                    TopicProblem(
                        "InputTopicMissing",
                        topic,
                        f"input topic {topic!r} does not exist: create it, or fix inputTopics",
                    )
                )
        present = {topic: counts[topic] for topic in inputs if topic in counts}
        if len(set(present.values())) > 1:
            listing = ", ".join(f"{topic} ({count})" for topic, count in sorted(present.items()))
            problems.append(
                TopicProblem(
                    "InputTopicsNotCoPartitioned",
                    min(present),
                    f"the input topics have different partition counts: {listing}; task i reads "
                    "partition i of each, so give them all the same partition count",
                )
            )
            return None
        if len(present) != len(inputs):
            return None
        return next(iter(present.values()))

    def _create(self, missing: list[NewTopic], problems: list[TopicProblem]) -> list[str]:
        if not missing:
            return []
        try:
            futures = self._client().create_topics(missing, request_timeout=self._timeout)
        except KafkaException as refusal:
            problems.append(self._unreachable(refusal))
            return []

        def refused(name: str, error: KafkaError) -> TopicProblem:
            return TopicProblem(
                "TopicCreationFailed",
                name,
                f"cannot create topic {name!r}: {error.str()}; create it by hand or give "
                "the operator's Kafka principal the right to create topics",
            )

        # TOPIC_ALREADY_EXISTS: another reconciliation created it since the Metadata request.
        return self._done(futures, KafkaError.TOPIC_ALREADY_EXISTS, refused, "creating", problems)

    def _grow(self, to_grow: list[NewPartitions], problems: list[TopicProblem]) -> list[str]:
        """Add partitions to each changelog in `to_grow`; the names grown."""
        if not to_grow:
            return []
        try:
            futures = self._client().create_partitions(to_grow, request_timeout=self._timeout)
        except KafkaException as refusal:
            problems.append(self._unreachable(refusal))
            return []
        wanted = {growth.topic: growth.new_total_count for growth in to_grow}

        def refused(name: str, error: KafkaError) -> TopicProblem:
            return TopicProblem(
                "ChangelogGrowthFailed",
                name,
                f"the input topics have {wanted[name]} partitions but changelog topic "
                f"{name!r} cannot be grown to match: {error.str()}; the new tasks have "
                "no owner until it is: add the partitions with your Kafka tools, or "
                "give the operator's Kafka principal the right to alter topics",
            )

        # INVALID_PARTITIONS: another reconciliation grew it since the Metadata request.
        return self._done(futures, KafkaError.INVALID_PARTITIONS, refused, "growing", problems)

    def _done(
        self,
        futures: Mapping[str, Future[None]],
        done_already: int,
        refused: Callable[[str, KafkaError], TopicProblem],
        doing: str,
        problems: list[TopicProblem],
    ) -> list[str]:
        """The topics whose request (`doing` them) succeeded; a refusal other than
        `done_already` and a timeout are problems."""
        done = []
        for name, future in futures.items():
            try:
                future.result(self._timeout)
            except KafkaException as exception:
                error: KafkaError = exception.args[0]
                if error.code() != done_already:
                    problems.append(refused(name, error))
                continue
            except TimeoutError:
                problems.append(self._unreachable(f"{doing} topic {name!r} timed out"))
                continue
            done.append(name)
        return done

    def _retention_problems(self, changelogs: list[str]) -> list[TopicProblem]:
        if not changelogs:
            return []
        resources = [ConfigResource("topic", changelog) for changelog in changelogs]
        try:
            futures = self._client().describe_configs(resources, request_timeout=self._timeout)
        except KafkaException as error:
            return [self._unreachable(error)]
        problems = []
        for resource, future in futures.items():
            try:
                configs = future.result(self._timeout)
            except (KafkaException, TimeoutError) as error:
                return [self._unreachable(error)]
            policy = configs["cleanup.policy"].value if "cleanup.policy" in configs else "delete"
            if set((policy or "delete").split(",")) != {"compact"}:
                problems.append(
                    TopicProblem(
                        "ChangelogRetention",
                        resource.name,
                        f"changelog topic {resource.name!r} has cleanup.policy={policy}: "
                        "retention would delete state the app restores from; set "
                        "cleanup.policy=compact on it",
                    )
                )
        return problems

    def _unreachable(self, error: object) -> TopicProblem:
        return TopicProblem(
            "KafkaUnavailable",
            None,
            f"cannot reach the Kafka cluster at {self._bootstrap} ({error}): check "
            "spec.kafka.bootstrapServers and the network between the operator and the brokers",
        )

    def delete_state(self, app: StreamingApp) -> list[str]:
        """Delete the topics that hold the app's state (its changelogs and its assignments
        topic); the names deleted. Kafka's refusal (other than an already missing topic) is
        raised as KafkaException."""
        app_id = application_id(app)
        topics = [
            names.changelog_topic(app_id, store.name, store.changelog_topic)
            for store in app.spec.kafka.state_stores
        ] + [names.assignments_topic(app_id)]
        futures = self._client().delete_topics(topics, operation_timeout=self._timeout)
        deleted = []
        for topic, future in futures.items():
            try:
                future.result(self._timeout)
            except KafkaException as error:
                if error.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
                continue
            deleted.append(topic)
        return sorted(deleted)

    def close(self) -> None:
        """Release the admin client; the manager cannot be used afterwards."""
        self._admin = None
