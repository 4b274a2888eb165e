package flow.spark;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;

import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsAction;
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
    Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission));
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

  static Set<PosixFilePermission> posix(FsPermission permission) {
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    add(set, permission.getUserAction(), PosixFilePermission.OWNER_READ,
        PosixFilePermission.OWNER_WRITE, PosixFilePermission.OWNER_EXECUTE);
    add(set, permission.getGroupAction(), PosixFilePermission.GROUP_READ,
        PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_EXECUTE);
    add(set, permission.getOtherAction(), PosixFilePermission.OTHERS_READ,
        PosixFilePermission.OTHERS_WRITE, PosixFilePermission.OTHERS_EXECUTE);
    return set;
  }

  private static void add(
      Set<PosixFilePermission> set,
      FsAction action,
      PosixFilePermission read,
      PosixFilePermission write,
      PosixFilePermission execute) {
    if (action.implies(FsAction.READ)) {
      set.add(read);
    }
    if (action.implies(FsAction.WRITE)) {
      set.add(write);
    }
    if (action.implies(FsAction.EXECUTE)) {
      set.add(execute);
    }
  }
}
