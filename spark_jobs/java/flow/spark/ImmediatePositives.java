package flow.spark;

import java.sql.Timestamp;
import java.time.Instant;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.List;

import org.apache.spark.api.java.function.MapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Encoders;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.streaming.ExpiredTimerInfo;
import org.apache.spark.sql.streaming.ListState;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.streaming.StatefulProcessor;
import org.apache.spark.sql.streaming.TTLConfig;
import org.apache.spark.sql.streaming.TimeMode;
import org.apache.spark.sql.streaming.TimerValues;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

import scala.jdk.javaapi.CollectionConverters;

/**
 * The immediate label strategy's positives: each event again, with its label, when a label
 * event of its key arrives within the window; a label event that labelled nothing comes out
 * alone once the watermark has passed it. This is what a right outer stream-stream join on
 * {@code key = key AND event_time <= label_time <= event_time + window} emits, kept as
 * transformWithState with event-time timers instead.
 *
 * <p>Why: Spark 4.1's stream-stream join finds the rows it may evict by scanning all of its
 * state every micro-batch (SPARK-55144), so a batch costs more the more impressions the window
 * holds (about 4 ms of task time per 1,000 rows). Timers are kept in an index by time, so a
 * batch here touches the keys it reads and the rows that expire, nothing else.
 *
 * <p>The input is the events and the label events in one frame (a column tells them apart);
 * both arrive watermarked and deduplicated, so rows at or before the watermark have been
 * dropped already.
 */
public final class ImmediatePositives extends StatefulProcessor<String, Row, Row> {
  private static final long serialVersionUID = 1L;

  private final StructType eventSchema;
  private final StructType labelSchema;
  private final StructType outputSchema;
  private final int[] eventFields;
  private final int side;
  private final int eventTime;
  private final int eventProduced;
  private final int labelTime;
  private final int labelProduced;
  private final long windowMicros;

  private transient ListState<Row> events;
  private transient ListState<Row> labels;

  private ImmediatePositives(
      StructType input,
      List<String> eventColumns,
      String sideColumn,
      String eventTimeColumn,
      String producedColumn,
      String labelTimeColumn,
      String labelProducedColumn,
      long windowMicros,
      String label,
      String labelTimeName,
      String unmatched) {
    this.eventFields = new int[eventColumns.size()];
    StructField[] fields = new StructField[eventColumns.size()];
    for (int i = 0; i < fields.length; i++) {
      eventFields[i] = input.fieldIndex(eventColumns.get(i));
      fields[i] = input.fields()[eventFields[i]];
    }
    this.eventSchema = new StructType(fields);
    this.side = input.fieldIndex(sideColumn);
    this.eventTime = eventColumns.indexOf(eventTimeColumn);
    this.eventProduced = producedColumn == null ? -1 : eventColumns.indexOf(producedColumn);
    this.labelTime = input.fieldIndex(labelTimeColumn);
    this.labelProduced = input.fieldIndex(labelProducedColumn);
    if (eventTime < 0) {
      throw new IllegalArgumentException(eventTimeColumn + " is not among the event columns");
    }
    this.labelSchema =
        new StructType()
            .add("time", input.fields()[labelTime].dataType())
            .add("produced", input.fields()[labelProduced].dataType())
            .add("matched", DataTypes.BooleanType, false);
    this.outputSchema =
        eventSchema
            .add(label, DataTypes.DoubleType, false)
            .add(labelTimeName, input.fields()[labelTime].dataType())
            .add(unmatched, DataTypes.BooleanType, false);
    this.windowMicros = windowMicros;
  }

  /**
   * The positives of {@code input}, grouped by {@code keyColumn} (a string; rows whose key is
   * null are the caller's to leave out). {@code sideColumn} is true on an event's row, false on
   * a label event's.
   */
  public static Dataset<Row> apply(
      Dataset<Row> input,
      String keyColumn,
      List<String> eventColumns,
      String sideColumn,
      String eventTimeColumn,
      String producedColumn,
      String labelTimeColumn,
      String labelProducedColumn,
      long windowMicros,
      String label,
      String labelTimeName,
      String unmatched) {
    StructType schema = input.schema();
    ImmediatePositives processor =
        new ImmediatePositives(
            schema,
            eventColumns,
            sideColumn,
            eventTimeColumn,
            producedColumn,
            labelTimeColumn,
            labelProducedColumn,
            windowMicros,
            label,
            labelTimeName,
            unmatched);
    int key = schema.fieldIndex(keyColumn);
    return input
        .groupByKey((MapFunction<Row, String>) row -> row.getString(key), Encoders.STRING())
        .transformWithState(
            processor, TimeMode.EventTime(), OutputMode.Append(), Encoders.row(processor.outputSchema));
  }

  @Override
  public void init(OutputMode outputMode, TimeMode timeMode) {
    events = getHandle().getListState("events", Encoders.row(eventSchema), TTLConfig.NONE());
    labels = getHandle().getListState("labels", Encoders.row(labelSchema), TTLConfig.NONE());
  }

  @Override
  public scala.collection.Iterator<Row> handleInputRows(
      String key, scala.collection.Iterator<Row> rows, TimerValues timerValues) {
    // Most keys bring one event and nothing else: its row is appended without reading the
    // events held (they are read only when a label event needs them), and the label events
    // waiting are read once (usually none).
    List<Row> waiting = list(labels);
    List<Row> held = null;
    List<Row> added = new ArrayList<>();
    boolean labelsChanged = false;
    List<Row> out = new ArrayList<>();
    while (rows.hasNext()) {
      Row row = rows.next();
      if (row.getBoolean(side)) {
        Row event = eventOf(row);
        long at = micros(event.get(eventTime));
        for (int i = 0; i < waiting.size(); i++) {
          Row waits = waiting.get(i);
          if (inWindow(at, micros(waits.get(0)))) {
            out.add(positive(event, waits.get(0), waits.get(1)));
            if (!waits.getBoolean(2)) {
              waiting.set(i, RowFactory.create(waits.get(0), waits.get(1), true));
              labelsChanged = true;
            }
          }
        }
        added.add(event);
        if (held != null) {
          held.add(event);
        }
        getHandle().registerTimer(millisAfter(at + windowMicros));
      } else {
        if (held == null) {
          held = list(events);
          held.addAll(added);
        }
        Object time = row.get(labelTime);
        Object produced = row.get(labelProduced);
        long at = micros(time);
        boolean matched = false;
        for (Row event : held) {
          if (inWindow(micros(event.get(eventTime)), at)) {
            out.add(positive(event, time, produced));
            matched = true;
          }
        }
        waiting.add(RowFactory.create(time, produced, matched));
        labelsChanged = true;
        getHandle().registerTimer(millisAfter(at));
      }
    }
    if (!added.isEmpty()) {
      events.appendList(added.toArray(new Row[0]));
    }
    if (labelsChanged) {
      labels.put(waiting.toArray(new Row[0]));
    }
    return CollectionConverters.asScala(out.iterator());
  }

  @Override
  public scala.collection.Iterator<Row> handleExpiredTimer(
      String key, TimerValues timerValues, ExpiredTimerInfo expiredTimerInfo) {
    long watermark = timerValues.getCurrentWatermarkInMs() * 1000L;
    List<Row> out = new ArrayList<>();
    List<Row> held = list(events);
    List<Row> keep = new ArrayList<>();
    for (Row event : held) {
      if (micros(event.get(eventTime)) + windowMicros > watermark) {
        keep.add(event);
      }
    }
    replace(events, held.size(), keep);
    List<Row> waiting = list(labels);
    List<Row> still = new ArrayList<>();
    for (Row waits : waiting) {
      if (micros(waits.get(0)) > watermark) {
        still.add(waits);
      } else if (!waits.getBoolean(2)) {
        out.add(unmatched(waits.get(0), waits.get(1)));
      }
    }
    replace(labels, waiting.size(), still);
    return CollectionConverters.asScala(out.iterator());
  }

  private boolean inWindow(long eventAt, long labelAt) {
    return labelAt >= eventAt && labelAt <= eventAt + windowMicros;
  }

  private Row eventOf(Row row) {
    Object[] values = new Object[eventFields.length];
    for (int i = 0; i < values.length; i++) {
      values[i] = row.get(eventFields[i]);
    }
    return RowFactory.create(values);
  }

  /** The event again, labelled; produced when the later of it and its label event was. */
  private Row positive(Row event, Object time, Object produced) {
    Object[] values = new Object[eventFields.length + 3];
    for (int i = 0; i < eventFields.length; i++) {
      values[i] = event.get(i);
    }
    if (eventProduced >= 0) {
      values[eventProduced] = later(event.get(eventProduced), produced);
    }
    values[eventFields.length] = 1.0;
    values[eventFields.length + 1] = time;
    values[eventFields.length + 2] = false;
    return RowFactory.create(values);
  }

  /** A label event that labelled nothing: no event's columns, produced when it was. */
  private Row unmatched(Object time, Object produced) {
    Object[] values = new Object[eventFields.length + 3];
    if (eventProduced >= 0) {
      values[eventProduced] = produced;
    }
    values[eventFields.length] = 1.0;
    values[eventFields.length + 1] = time;
    values[eventFields.length + 2] = true;
    return RowFactory.create(values);
  }

  private static void replace(ListState<Row> state, int before, List<Row> after) {
    if (after.isEmpty()) {
      if (before > 0) {
        state.clear();
      }
    } else if (after.size() != before) {
      state.put(after.toArray(new Row[0]));
    }
  }

  /** The state's rows (none where it has none: get() alone, one read, not exists() first). */
  private static List<Row> list(ListState<Row> state) {
    List<Row> rows = new ArrayList<>();
    scala.collection.Iterator<Row> it = state.get();
    while (it.hasNext()) {
      rows.add(it.next());
    }
    return rows;
  }

  /** Spark's greatest(): the later of two times, either of which may be null. */
  private static Object later(Object a, Object b) {
    if (a == null) {
      return b;
    }
    if (b == null) {
      return a;
    }
    return micros(b) > micros(a) ? b : a;
  }

  /** A timer fires once the watermark has passed it; the rows it stands for go then. */
  private static long millisAfter(long micros) {
    return Math.floorDiv(micros, 1000L);
  }

  static long micros(Object time) {
    if (time instanceof Timestamp) {
      Timestamp t = (Timestamp) time;
      return Math.floorDiv(t.getTime(), 1000L) * 1_000_000L + t.getNanos() / 1000;
    }
    if (time instanceof Instant) {
      Instant t = (Instant) time;
      return t.getEpochSecond() * 1_000_000L + t.getNano() / 1000;
    }
    if (time instanceof LocalDateTime) {
      LocalDateTime t = (LocalDateTime) time;
      return t.toEpochSecond(ZoneOffset.UTC) * 1_000_000L + t.getNano() / 1000;
    }
    throw new IllegalArgumentException("not a time: " + time);
  }
}
