"""Pipeline definitions: functions that return validated definitions, run by ``flow run`` or
``spark-submit``. Composition only; they import ``flow`` and nothing else of this project."""
