package flow.spark;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system, without the processes it starts for two everyday calls.
 *
 * <p>Why: without Hadoop's native library (pyspark ships none), {@link RawLocalFileSystem} runs
 * {@code chmod} for every file it creates and {@code readlink} twice for every rename (through
 * {@code getFileLinkStatus}). A live micro-batch writes some 35 checkpoint files (offsets,
 * commits, each state store's changelog and their checksums): about a hundred processes a
 * batch. Recorded with Java Flight Recorder, a 150 s run of the live stage started 5,641 of
 * them, and a state store's commit (one changelog) took 85 ms a partition. These two calls do
 * the same here with the JDK's own file calls, in the calling thread.
 *
 * <p>Everything else is Hadoop's. A symbolic link is still resolved Hadoop's way, and so is a
 * permission with the sticky bit.
 */
public class ForklessRawLocalFileSystem extends RawLocalFileSystem {

  @Override
  public void setPermission(Path p, FsPermission permission) throws IOException {
    if (permission.getStickyBit()) {
      super.setPermission(p, permission);
      return;
    }
    // Without the sticky bit, Hadoop writes a permission as POSIX does ("rwxr-x---").
    Files.setPosixFilePermissions(
        pathToFile(p).toPath(), PosixFilePermissions.fromString(permission.toString()));
  }

  @Override
  public FileStatus getFileLinkStatus(Path f) throws IOException {
    File file = pathToFile(f);
    if (Files.isSymbolicLink(file.toPath())) {
      return super.getFileLinkStatus(f);
    }
    // Not a link: its status is the file's own (FileNotFoundException where there is none,
    // as Hadoop's).
    return getFileStatus(f);
  }
}
