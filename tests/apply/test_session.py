"""The Spark session's settings, and the JVM a local session runs."""

from __future__ import annotations

from sparkapply.apply.session import LOCAL_JAVA_OPTIONS, spark_settings


def test_a_local_session_compiles_with_c1_and_the_users_options_come_last() -> None:
    mine = "-XX:TieredStopAtLevel=4 -Dsomething=1"
    settings = spark_settings("local[2]", {"spark.driver.extraJavaOptions": mine})
    assert settings["spark.driver.extraJavaOptions"] == f"{LOCAL_JAVA_OPTIONS} {mine}"
    assert settings["spark.driver.host"] == "127.0.0.1"
    assert spark_settings("local[*]", None)["spark.driver.extraJavaOptions"] == LOCAL_JAVA_OPTIONS


def test_a_cluster_session_keeps_the_users_jvm_as_it_is() -> None:
    settings = spark_settings("spark://head:7077", {"spark.executor.memory": "4g"})
    assert "spark.driver.extraJavaOptions" not in settings
    assert "spark.driver.host" not in settings
    assert settings["spark.executor.memory"] == "4g"


def test_the_running_jvm_was_started_with_the_local_options(spark: object) -> None:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert LOCAL_JAVA_OPTIONS in args
