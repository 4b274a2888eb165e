package flow.spark;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's {@code file:} file system (checksummed, as {@link LocalFileSystem}) over {@link
 * ForklessRawLocalFileSystem}: the one {@code fs.file.impl} names for a local session.
 */
public class ForklessLocalFileSystem extends LocalFileSystem {
  public ForklessLocalFileSystem() {
    super(new ForklessRawLocalFileSystem());
  }
}
